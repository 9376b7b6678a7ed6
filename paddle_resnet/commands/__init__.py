"""What each command-line tool does, as functions: ``run(config)`` and ``main(argv)``.
The top-level train.py, export_model.py and inference.py only call ``main``."""
