"""Dialect estimation with the TwitterAAE demographic language model.

The TwitterAAE model of Blodgett, Green and O'Connor (EMNLP 2016, https://github.com/slanglab/twitteraae, MIT)
is a mixed-membership model with four "demographic topics" (African-American, Hispanic, Asian, White, in that
order). It ships as two files of the same length: `model_count_table.txt` (a word x topic count table N_wk) and
`model_vocab.txt` (one word per line, as the last tab-separated field). A tweet's topic proportions are inferred with
CVB0 (collapsed variational Bayes, zero-order): every in-vocabulary token gets a distribution over the four topics,
initialised with its word likelihood and updated token by token as ``q_i ∝ lik_i * (Σ_{j≠i} q_j + alpha)``; the
proportions are the normalised sum of the token distributions. A tweet counts as African-American English (AAE)
when the first topic has the largest proportion.

The flags feed [`~hf_defer.experts.dialect_biased_expert`], the "synthetic" HateSpeech expert of Mozannar et al. (2023).
The two tables lie beside this module in `research/data/twitteraae/` (gzip copies of the upstream files, MIT license,
upstream commit db4d6d1), checked against the upstream SHA-256 each time they are read; they are not part of the
installed package.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import io
import numbers
import os
import re
from collections.abc import Sequence

from pathlib import Path

import numpy as np

__all__ = ["SHIPPED_DIR", "SHIPPED_SHA256", "TOPICS", "TwitterAAE", "cvb0_proportions", "shipped_table", "tokenize_tweet"]

TOPICS: tuple[str, ...] = ("african_american", "hispanic", "asian", "white")
"""The four demographic topics of TwitterAAE, in the column order of `model_count_table.txt`."""

_DROP = re.compile(r"(?:https?://|www\.)\S+|@\w+:?", re.IGNORECASE)
_TOKEN = re.compile(
    r"[:;=][\-o']?[()\[\]dDpP/\\|]"  # emoticons such as :) ;-( :P
    r"|#\w+"  # hashtags
    r"|\w+(?:['’*]\w+)*"  # words, with inner apostrophes or masking stars (ain't, b*tch)
    r"|([^\w\s])\1*"  # a run of one punctuation character (!!!, ??, ...)
)


def tokenize_tweet(text: str) -> list[str]:
    """Split a tweet into lower-cased tokens the way the TwitterAAE vocabulary spells them.

    HTML entities are decoded first (the HateSpeech tweets contain ``&amp;`` and ``&#8220;``); URLs and
    ``@mentions`` (with a colon right after them) are dropped (they carry no dialect and are not in the
    vocabulary), and so is the retweet marker ``rt``. What remains is split into emoticons, hashtags, words (keeping inner apostrophes: ``ain't``)
    and runs of one punctuation character (``!!!``).

    Args:
        text (`str`): the tweet.

    Returns:
        `list[str]`: the tokens, lower-cased.

    Example:

    ```python
    >>> from research.twitteraae import tokenize_tweet
    >>> tokenize_tweet("RT @bob: I ain't finna go!!! :) http://t.co/x")
    ['i', "ain't", 'finna', 'go', '!!!', ':)']

    ```
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}.")
    text = _DROP.sub(" ", html.unescape(text))
    tokens = [match.group(0).lower() for match in _TOKEN.finditer(text)]
    return [token for token in tokens if token != "rt"]


def cvb0_proportions(likelihoods: np.ndarray, alpha: float = 1.0, num_passes: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """CVB0 inference of a document's topic proportions from its tokens' word likelihoods.

    Each token ``i`` keeps a distribution ``q_i`` over the ``T`` topics, initialised to its normalised likelihood
    ``lik_i``. Each of the ``num_passes - 1`` passes visits the tokens in order and sets
    ``q_i ∝ lik_i * (Σ_{j≠i} q_j + alpha)`` (the sum uses the tokens already updated in this pass). The document's
    proportions are ``Σ_i q_i`` normalised. At a fixed point every ``q_i`` satisfies its update exactly.

    Args:
        likelihoods (`np.ndarray` of shape `[n, T]`): positive word likelihoods ``p(word_i | topic)``, one row per
            token (``n >= 1``).
        alpha (`float`, *optional*, defaults to 1.0): symmetric Dirichlet prior on the proportions (> 0).
        num_passes (`int`, *optional*, defaults to 5): 1 + the number of update sweeps (TwitterAAE's default is 5).

    Returns:
        `tuple[np.ndarray, np.ndarray]`: the proportions ``[T]`` (summing to 1) and the token distributions
        ``[n, T]`` (each row summing to 1).

    Example:

    ```python
    >>> import numpy as np
    >>> from research.twitteraae import cvb0_proportions
    >>> theta, _ = cvb0_proportions(np.array([[3.0, 1.0]]))  # one token: its normalised likelihood
    >>> theta.tolist()
    [0.75, 0.25]

    ```
    """
    lik = np.asarray(likelihoods, dtype=np.float64)
    if lik.ndim != 2 or lik.shape[0] < 1 or lik.shape[1] < 1:
        raise ValueError(f"likelihoods must have shape [num_tokens >= 1, num_topics >= 1], got {lik.shape}.")
    if not np.isfinite(lik).all() or (lik <= 0).any():
        raise ValueError("likelihoods must be finite and positive.")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not alpha > 0:
        raise ValueError(f"alpha must be a positive number, got {alpha!r}.")
    if isinstance(num_passes, bool) or not isinstance(num_passes, numbers.Integral) or num_passes < 1:
        raise ValueError(f"num_passes must be a positive integer, got {num_passes!r}.")
    lik = lik / lik.sum(axis=1, keepdims=True)
    q = lik.copy()
    total = q.sum(axis=0)
    for _ in range(int(num_passes) - 1):
        for i in range(q.shape[0]):
            total -= q[i]
            row = lik[i] * (total + alpha)
            q[i] = row / row.sum()
            total += q[i]
    return total / total.sum(), q


_TABLES = ("model_count_table.txt", "model_vocab.txt")

SHIPPED_DIR = Path(__file__).resolve().parent / "data" / "twitteraae"
"""The gzip copies of the two upstream tables (github.com/slanglab/twitteraae model/ @ db4d6d1, MIT: `LICENSE`)."""

SHIPPED_SHA256 = {
    "model_count_table.txt": "9907158995bea09301022050736bb91dda71bd577af9d3e643ae434d5c3fbf4e",
    "model_vocab.txt": "6ef8e0ed59ed13776ad015a7dc14a0dd26a24ce9f6906edf860dfe40bf679133",
}
"""SHA-256 of each upstream table, decompressed."""


def shipped_table(name: str) -> bytes:
    """The upstream bytes of one table of `research/data/twitteraae/`, after checking their SHA-256.

    Args:
        name (`str`): ``"model_count_table.txt"`` or ``"model_vocab.txt"``.

    Returns:
        `bytes`: the upstream file, byte for byte.

    Raises:
        `ValueError`: `name` is not one of the two tables.
        `OSError`: the copy is missing, not valid gzip, or does not match its upstream checksum.
    """
    if name not in SHIPPED_SHA256:
        raise ValueError(f"name must be one of {sorted(SHIPPED_SHA256)}, got {name!r}.")
    path = SHIPPED_DIR / f"{name}.gz"
    try:
        data = gzip.decompress(path.read_bytes())
    except (OSError, EOFError) as error:
        raise OSError(f"the TwitterAAE table {os.fspath(path)!r} is missing or damaged ({error}).") from error
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHIPPED_SHA256[name]:
        raise OSError(f"the TwitterAAE table {os.fspath(path)!r} does not match its upstream checksum (expected "
                      f"SHA-256 {SHIPPED_SHA256[name]}, got {digest}).")
    return data


def _read_table(model_dir: str | os.PathLike, name: str) -> bytes:
    """The bytes of ``model_dir/name``, or of ``model_dir/name.gz`` decompressed."""
    path = os.path.join(model_dir, name)
    if os.path.isfile(path):
        with open(path, "rb") as handle:
            return handle.read()
    if os.path.isfile(path + ".gz"):
        with gzip.open(path + ".gz", "rb") as handle:
            return handle.read()
    raise ValueError(
        f"model_dir must contain model_count_table.txt and model_vocab.txt (or their .gz); {path} is missing."
    )


class TwitterAAE:
    """The TwitterAAE demographic dialect model (Blodgett et al., 2016).

    Args:
        model_dir (`str` or `os.PathLike`, *optional*):
            Folder holding `model_count_table.txt` and `model_vocab.txt` (each may be gzip-compressed, `.txt.gz`).
            Defaults to `$HF_DEFER_TWITTERAAE` when set, else the copy in `research/data/twitteraae/` (MIT license,
            upstream commit db4d6d1, checked against its SHA-256 when read).
        alpha (`float`, *optional*, defaults to 1.0): CVB0 Dirichlet prior.
        num_passes (`int`, *optional*, defaults to 5): CVB0 passes.
        min_tokens (`int`, *optional*, defaults to 1): fewest in-vocabulary tokens needed for an estimate.
        min_in_vocab (`float`, *optional*, defaults to 0.2): smallest share of in-vocabulary tokens needed.

    Example:

    ```python
    >>> from research.twitteraae import TwitterAAE
    >>> model = TwitterAAE()  # the tables in research/data/twitteraae/
    >>> model.is_aae(["he finna go to the sto lol", "I am going to the store tomorrow."]).tolist()
    [True, False]

    ```
    """

    def __init__(
        self,
        model_dir: str | os.PathLike | None = None,
        alpha: float = 1.0,
        num_passes: int = 5,
        min_tokens: int = 1,
        min_in_vocab: float = 0.2,
    ) -> None:
        if model_dir is None:
            model_dir = os.environ.get("HF_DEFER_TWITTERAAE") or None
        if model_dir is None:
            tables = [shipped_table(name) for name in _TABLES]
        elif isinstance(model_dir, (str, os.PathLike)):
            tables = [_read_table(model_dir, name) for name in _TABLES]
        else:
            raise TypeError(f"model_dir must be a str, a path or None, got {type(model_dir).__name__}.")
        counts = np.loadtxt(io.BytesIO(tables[0]), dtype=np.float64, ndmin=2)
        vocab = [line.split("\t")[-1].strip() for line in tables[1].decode("utf-8").split("\n")]
        if vocab and vocab[-1] == "":  # the final newline
            vocab.pop()
        if counts.shape != (len(vocab), len(TOPICS)):
            raise ValueError(
                f"model_count_table.txt must have one row of {len(TOPICS)} counts per vocabulary word "
                f"({len(vocab)}), got shape {counts.shape}."
            )
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, numbers.Integral) or min_tokens < 1:
            raise ValueError(f"min_tokens must be a positive integer, got {min_tokens!r}.")
        if isinstance(min_in_vocab, bool) or not isinstance(min_in_vocab, numbers.Real) or not 0 <= min_in_vocab <= 1:
            raise ValueError(f"min_in_vocab must be a share in [0, 1], got {min_in_vocab!r}.")
        cvb0_proportions(np.ones((1, 1)), alpha, num_passes)  # validates alpha and num_passes
        # Add-one smoothed p(word | topic); as in TwitterAAE, a repeated vocabulary word keeps its last row.
        self.word_likelihoods = (counts + 1.0) / counts.sum(axis=0)
        self.word_index = {word: index for index, word in enumerate(vocab)}
        self.alpha, self.num_passes = float(alpha), int(num_passes)
        self.min_tokens, self.min_in_vocab = int(min_tokens), float(min_in_vocab)

    def proportions(self, text: str) -> np.ndarray | None:
        """The four topic proportions (order of [`TOPICS`]) of one tweet, or None when too few tokens are known.

        Args:
            text (`str`): the tweet.

        Returns:
            `np.ndarray` of shape `[4]` summing to 1, or `None` when fewer than `min_tokens` tokens (or a share
            below `min_in_vocab` of them) are in the vocabulary.
        """
        tokens = tokenize_tweet(text)
        known = [self.word_index[token] for token in tokens if token in self.word_index]
        if len(known) < self.min_tokens or len(known) < self.min_in_vocab * len(tokens):
            return None
        return cvb0_proportions(self.word_likelihoods[known], self.alpha, self.num_passes)[0]

    def predict(self, texts: Sequence[str]) -> np.ndarray:
        """Topic proportions of many tweets.

        Args:
            texts (sequence of `str`): the tweets.

        Returns:
            `np.ndarray` of shape `[N, 4]`; rows of tweets without an estimate are NaN.
        """
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of tweets, got a single str; wrap it in a list.")
        out = np.full((len(texts), len(TOPICS)), np.nan)
        for row, text in enumerate(texts):
            estimate = self.proportions(text)
            if estimate is not None:
                out[row] = estimate
        return out

    def is_aae(self, texts: Sequence[str]) -> np.ndarray:
        """Whether each tweet is African-American English: the AA topic has the largest proportion.

        Tweets without an estimate count as not AAE.

        Args:
            texts (sequence of `str`): the tweets.

        Returns:
            `np.ndarray` of `bool`, shape `[N]`.
        """
        proportions = self.predict(texts)
        known = ~np.isnan(proportions).any(axis=1)
        flags = np.zeros(len(proportions), dtype=bool)
        flags[known] = proportions[known].argmax(axis=1) == 0
        return flags
