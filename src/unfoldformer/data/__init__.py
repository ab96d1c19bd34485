"""Data: locating/downloading the data files, SST-2 and IMDB readers, and
static word-embedding tables with their tokenisers.

See :mod:`unfoldformer.data.files`, :mod:`unfoldformer.data.datasets` and
:mod:`unfoldformer.data.embeddings` for the details (search order, formats,
validation, OOV policy).
"""

from .batching import seeded_subset
from .datasets import (
    DATASET_NAMES,
    EVAL_SPLITS,
    LABELLED_SPLITS,
    TextExample,
    dataset_files,
    dataset_record,
    load_dataset,
    load_imdb,
    load_sst2,
)
from .embeddings import EncodedBatch, StaticEmbeddings, load_embeddings, word_tokenize
from .files import DataFormatError, DataNotFoundError, file_record, find_data_file, sha256_file

__all__ = [
    "DATASET_NAMES",
    "DataFormatError",
    "EVAL_SPLITS",
    "DataNotFoundError",
    "LABELLED_SPLITS",
    "EncodedBatch",
    "StaticEmbeddings",
    "TextExample",
    "dataset_files",
    "dataset_record",
    "file_record",
    "find_data_file",
    "load_dataset",
    "load_embeddings",
    "load_imdb",
    "load_sst2",
    "seeded_subset",
    "sha256_file",
    "word_tokenize",
]
