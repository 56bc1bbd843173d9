"""The `rlds_package` TFDS dataset builder (see rlds_package_dataset_builder.py)."""
