"""Input data: image trees (folder.py), record files (records.py), DALI pipelines (dali.py)
and the demo data set (fashion_mnist.py)."""
