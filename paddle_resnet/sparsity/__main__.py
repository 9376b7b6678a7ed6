from paddle_resnet.sparsity.check import main

raise SystemExit(main())
