"""Distillation of a pretrained encoder (all-MiniLM-L6-v2) into certified joint layers.

`teacher` (the teacher and its input layer), `student` (`DistilledEncoder`), `corpus` (the training
texts as word-piece windows), `config` (`DistillConfig`), `loop` (`distill`: resumable training).
"""
from .student import DistilledEncoder
from .teacher import Teacher, WordPieces, mean_pool

__all__ = ["DistilledEncoder", "Teacher", "WordPieces", "mean_pool"]
