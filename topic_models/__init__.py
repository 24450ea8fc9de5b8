"""Topic models over token-id documents (no knowledge of tickets): DocNADE (PyTorch) and the LDA baseline (gensim)."""
from .docnade import DocNADE, DocNADEConfig, TopicModelError, fit

__all__ = ["DocNADE", "DocNADEConfig", "TopicModelError", "fit"]
