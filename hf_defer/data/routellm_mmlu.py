"""RouteLLM's MMLU results: for each of the 14,042 MMLU test questions, whether GPT-4 and Mixtral-8x7B answered it right.

Ong et al. (2024, "RouteLLM: Learning to Route LLMs with Preference Data", arXiv:2406.18665) evaluate routers between
`gpt-4-1106-preview` (the strong model) and `Mixtral-8x7B-Instruct-v0.1` (the weak model) on MMLU (5-shot) and publish
each model's correctness per question. The 57 per-subject CSVs and the list of 5 contaminated prompts (questions too
similar to a router's training data, which RouteLLM's evaluation drops) ship inside the package as one gzip'd tar
(`hf_defer/data/bundled/routellm-mmlu/`, Apache-2.0, every member checked against the upstream SHA-256 when read).

- [`load_routellm_mmlu`]: the questions as one `datasets.Dataset` with `prompt`, `subject` and one boolean
  correctness column per model.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import datasets
import numpy as np
import pandas as pd

from .bundled_data import bundled_tar_members

__all__ = [
    "ROUTELLM_MMLU_CITATION",
    "ROUTELLM_MMLU_MEMBER_SHA256",
    "ROUTELLM_MMLU_STRONG",
    "ROUTELLM_MMLU_WEAK",
    "load_routellm_mmlu",
]

ROUTELLM_MMLU_STRONG = "gpt-4-1106-preview"
"""Column of the strong model's correctness (upstream column `gpt-4-1106-preview`)."""
ROUTELLM_MMLU_WEAK = "mixtral-8x7b-instruct"
"""Column of the weak model's correctness (upstream column `mistralai/Mixtral-8x7B-Instruct-v0.1`)."""
_UPSTREAM_COLUMNS = {"gpt-4-1106-preview": ROUTELLM_MMLU_STRONG,
                     "mistralai/Mixtral-8x7B-Instruct-v0.1": ROUTELLM_MMLU_WEAK}

ROUTELLM_MMLU_CITATION = """@inproceedings{ong2025routellm,
  title     = {{RouteLLM}: Learning to Route {LLMs} with Preference Data},
  author    = {Ong, Isaac and Almahairi, Amjad and Wu, Vincent and Chiang, Wei-Lin and Wu, Tianhao and
               Gonzalez, Joseph E. and Kadous, M Waleed and Stoica, Ion},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year      = {2025},
  note      = {arXiv:2406.18665}
}
@inproceedings{hendrycks2021mmlu,
  title     = {Measuring Massive Multitask Language Understanding},
  author    = {Hendrycks, Dan and Burns, Collin and Basart, Steven and Zou, Andy and Mazeika, Mantas and Song, Dawn
               and Steinhardt, Jacob},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year      = {2021}
}"""
"""BibTeX of RouteLLM (whose data this is, Apache-2.0) and of MMLU (the questions, MIT)."""

# SHA-256 of each upstream file, github.com/lm-sys/RouteLLM routellm/evals/mmlu/<name>
# @ 0b64fdafe049e596a3f5657c219329f24af24198 (the response files last changed in fbc851126beb19d6385d98c934554614135baa69).
ROUTELLM_MMLU_MEMBER_SHA256: dict[str, str] = dict((
    ("contaminated_prompts.jsonl", "9606c968198eabf5efa46ccba31286392c8e35525d83c86661618ffc5ec6d40e"),
    ("responses/mmlu_abstract_algebra.csv", "67e564eea42e71fbfcaf616972df952c316e5538376da1c16d691177458b96b9"),
    ("responses/mmlu_anatomy.csv", "53ebea8257805eeecc25713728264b8235cffad7b720962a3eafc92fd27ef537"),
    ("responses/mmlu_astronomy.csv", "49915ece9dfe8aadbd351f221ada2ea86b6f832ce49fa64d1622a0f066c19794"),
    ("responses/mmlu_business_ethics.csv", "13a45bed754ffe8f0e7f0348e69085c648a1ae0e91aa76cd5e6906fa45f7ec8e"),
    ("responses/mmlu_clinical_knowledge.csv", "5ea37709bfbad4df7a3fcbd8973413f7645a2adfef9772490f09d3f293ffe882"),
    ("responses/mmlu_college_biology.csv", "c38620db5b9f6f1b0fde7bc8d8299b8e2305c4dacbb1567c904cd51618d627d5"),
    ("responses/mmlu_college_chemistry.csv", "78ca6ba22ff25c8fdb93e1c6e84384e72522106c73ed5ee9fed620928ce395ce"),
    ("responses/mmlu_college_computer_science.csv", "8a7b2a87a36b428c9d1a8f12ce3b01cf7920f0a7146d6f8a111da6749c332da3"),
    ("responses/mmlu_college_mathematics.csv", "3f22f42779c48509c66e21d7d1fc3054eb0256c1b5b772bb6d9a3af1b253238b"),
    ("responses/mmlu_college_medicine.csv", "63d71d29e630fc6538e1705a51f4267bdbbdea0fa7ee85056ad7d6f8f10d3987"),
    ("responses/mmlu_college_physics.csv", "8162a0660d4ef7b963088e0a176d4b8630096127a0d0b5ed003f649cbad34455"),
    ("responses/mmlu_computer_security.csv", "26446faf7460f03aa2d82a05c170faedb5cbf6d7bdda133b1146229107097d1c"),
    ("responses/mmlu_conceptual_physics.csv", "ea40473704b64cb60d564ffe91962848ec6fc3106b40089d08cebc98d5c7226d"),
    ("responses/mmlu_econometrics.csv", "927b4d877cec8697f3b8378bb7e7c7a279babaea2edacf350ea50908701907b9"),
    ("responses/mmlu_electrical_engineering.csv", "de2fb7c2e9addb4808f5b3f7c79efbfdfb86216235bb7dc28ab70bc53664f11e"),
    ("responses/mmlu_elementary_mathematics.csv", "88697ff0d238b5852c7a959379dc8b0b45c3554ed4b2ee7cbb7ffc34e06c7cf5"),
    ("responses/mmlu_formal_logic.csv", "094a462626468569ad595c03e66e73a299188cfa175248b499dba94e005506e6"),
    ("responses/mmlu_global_facts.csv", "6f75ddf7d6eb94ac0471529a85ff7f8b738c9f4055185b3114eed26393222d06"),
    ("responses/mmlu_high_school_biology.csv", "444982fc2c750ab8cbc6942a0c0267040aa5023c1d2364247d20e2a28b4e325d"),
    ("responses/mmlu_high_school_chemistry.csv", "ae5e62479365dcd056354c568f60da65b1df9f1de57dda3953a8e9933a6f12e4"),
    ("responses/mmlu_high_school_computer_science.csv",
     "d156d9448a6e899f7f976a0afac148a928bf709a2baa573f0c407854a25bdb11"),
    ("responses/mmlu_high_school_european_history.csv",
     "c64afd6c5e30ef0cd5c10beab961ac05e7ba55d6b48cd93bf6ad0a45f90515bf"),
    ("responses/mmlu_high_school_geography.csv", "21b12044be4a6b9813880ad46372006dc0846e7f85fa46883bb73dbd90fba30a"),
    ("responses/mmlu_high_school_government_and_politics.csv",
     "2791689acc61775a5857f4f3a5fd248d30552553c3a96f6ee63dc28285437259"),
    ("responses/mmlu_high_school_macroeconomics.csv",
     "73b931a2a06ba74a5c9f1e005d45a25004e36be5d075d98f8ebcf89b3fda367b"),
    ("responses/mmlu_high_school_mathematics.csv", "151b2a736981b7b20f3bad99de6a573e4692d68cf87020e943b601b70bb37390"),
    ("responses/mmlu_high_school_microeconomics.csv",
     "f7ea151efb4c9d96374db3358ac7e97e4d8349e26715f61dac98bc9d854ca046"),
    ("responses/mmlu_high_school_physics.csv", "1e2103fc8f7f1cfac7c00952b26db2418acab092486af78a9c51c551ae2ff9be"),
    ("responses/mmlu_high_school_psychology.csv", "d11604f2c7a2425258d5b9a285ef71737c011cc3a91456890f088a0ee4c55212"),
    ("responses/mmlu_high_school_statistics.csv", "de6642bcd93d7a80e7bbd73d987a44d67b6e537b47749ddc518122fd582703bb"),
    ("responses/mmlu_high_school_us_history.csv", "a71186d143363e203b2f216d78c9d21f10cca51de455ef176c9c01b77f546592"),
    ("responses/mmlu_high_school_world_history.csv",
     "e9c52305977dc37b3e48eee727ad933b2d24d96ca3a06aec865a8900b1e87d2c"),
    ("responses/mmlu_human_aging.csv", "0d6c4109b4f61f138781ce50bbc60ff2e90dd451694d3926a088be5a5bd88aa8"),
    ("responses/mmlu_human_sexuality.csv", "20916037e3012731883f926738daf47ed994f74ba25518fdb7f0df72a81143fd"),
    ("responses/mmlu_international_law.csv", "e389b886e3e1570bfdf798f6f56dc3c675350200c5baf0f41a0766294ff312eb"),
    ("responses/mmlu_jurisprudence.csv", "7e94c3849231be7b2654db11e44ee51531f8474e300fe83b1e05438df3038f0b"),
    ("responses/mmlu_logical_fallacies.csv", "fa2d94cd2e901621aaebd0a7e64560b5dbbe4249086795398533eed2561c0c1e"),
    ("responses/mmlu_machine_learning.csv", "9301e928481be6e20b3541e1ac112b25a4a71338b21592978c0d219cb6240020"),
    ("responses/mmlu_management.csv", "a00b12ab0265918f9335a85ce02303ddaea0491a7b099f88a05986eeac4aa4fb"),
    ("responses/mmlu_marketing.csv", "3ee0b6560ebe0eb4f14ce63227d6f6ec8cb8b6e57e345eae9460be742672f36c"),
    ("responses/mmlu_medical_genetics.csv", "7c830f87dcbc0029137b3400cf361931831cb57dda55717a64e72ad74663d5df"),
    ("responses/mmlu_miscellaneous.csv", "c2e1a5b0394a8429f55b6340e1865166ac17ec6b3571523005e413b3b2843b9f"),
    ("responses/mmlu_moral_disputes.csv", "8b2b973b1987b724f39fd10970604d7f1150747a0db9ce766c193bd978c9d0c4"),
    ("responses/mmlu_moral_scenarios.csv", "78ded6fdca1cd0d5c4ed16a5ed4aebf2e98401b9c00b20e565e6cce5bf1153c7"),
    ("responses/mmlu_nutrition.csv", "ba197fbf4b6c5034414d66ea7747211056cf5f709f83d919d2d856245720cc51"),
    ("responses/mmlu_philosophy.csv", "2f30ad01ab529ddea00dff4ff87e950fef838a78754c94f6884120628a7d0591"),
    ("responses/mmlu_prehistory.csv", "afc816d4b78814627bae9b8c3730a9bb72bd958ff6259fd36c981777cfe83753"),
    ("responses/mmlu_professional_accounting.csv", "fe5ee976a625832ecf624086103619523d063a3a728c60681b6a53c55b638a37"),
    ("responses/mmlu_professional_law.csv", "60a4308df4f481ff8840590b29061835207b50a9f06a9fc68baf12b114f7e2e0"),
    ("responses/mmlu_professional_medicine.csv", "6fda30b523e4e2ce8b1f18e871a0722190a4ac81ec377a75fbba4a63e0b510f7"),
    ("responses/mmlu_professional_psychology.csv", "bfb3a7fb653e2b195d3fa258894af64d3f1c3dbd4059c1e0feb728131d20f9b3"),
    ("responses/mmlu_public_relations.csv", "2196279ea2535fbda62509c3156209b764459a3d515a9ba84b69cf16bb4c27d0"),
    ("responses/mmlu_security_studies.csv", "1354bb17649f95b7dd8ef3179e22329abe6bef84e639d63370ae9e80b2509905"),
    ("responses/mmlu_sociology.csv", "903ba6259b13f2877607abef22b7b19cb575104268d4ced615e3129d3caafb47"),
    ("responses/mmlu_us_foreign_policy.csv", "f1c1d266753a3f161e2018c16c6948fb78c7f5e506a10b4fc0441049962a6c69"),
    ("responses/mmlu_virology.csv", "d525f1ba88982befd42140e73822fe940e73db82bbdcdd569d95f26c3dd41e68"),
    ("responses/mmlu_world_religions.csv", "49dc00d44e069ecaac6a7f7e2188f4a8bce5df56ee91bb15f55519d07f64af8e"),
))
"""SHA-256 of every upstream file (RouteLLM @ 0b64fda), keyed by its path under `routellm/evals/mmlu/`; the shipped
archive's members are checked against these each time it is read."""

_RESPONSES = re.compile(r"^responses/mmlu_([a-z_]+)\.csv$")
_CONTAMINATED = "contaminated_prompts.jsonl"


def _read_directory(directory: Path) -> dict[str, bytes]:
    """The upstream files of a local copy of `routellm/evals/mmlu/` (not checksummed: a user's own results)."""
    files = {f"responses/{path.name}": path.read_bytes() for path in sorted((directory / "responses").glob("mmlu_*.csv"))}
    if not files:
        raise FileNotFoundError(f"`path` {os.fspath(directory)!r} has no responses/mmlu_<subject>.csv files; expected a "
                                "copy of RouteLLM's routellm/evals/mmlu/ folder.")
    contaminated = directory / _CONTAMINATED
    if contaminated.is_file():
        files[_CONTAMINATED] = contaminated.read_bytes()
    return files


def _correctness(frame: pd.DataFrame, column: str, where: str) -> np.ndarray:
    """A column of booleans (`True`/`False`, or 0/1) as a bool array; a clear error naming the column otherwise."""
    values = frame[column]
    if values.dtype == bool:
        return values.to_numpy()
    text = values.astype(str).str.strip().str.lower()
    mapping = {"true": True, "false": False, "1": True, "0": False, "1.0": True, "0.0": False}
    bad = ~text.isin(list(mapping))
    if bad.any():
        rows = np.flatnonzero(bad.to_numpy())[:5].tolist()
        raise ValueError(f"{where}: column {column!r} must hold booleans (True/False or 1/0); rows {rows} have "
                         f"{values.iloc[rows].tolist()}.")
    return text.map(mapping).to_numpy(dtype=bool)


def _subject_frame(name: str, data: bytes, where: str) -> pd.DataFrame:
    subject = _RESPONSES.match(name).group(1)
    frame = pd.read_csv(io.BytesIO(data), dtype={"prompt": str}, keep_default_na=False)
    missing = [column for column in ("prompt", *_UPSTREAM_COLUMNS) if column not in frame.columns]
    if missing:
        raise ValueError(f"{where}: {name} lacks the columns {missing}; found {list(map(str, frame.columns))}.")
    return pd.DataFrame({
        "prompt": frame["prompt"].astype(str),
        "subject": subject,
        **{ours: _correctness(frame, theirs, f"{where}: {name}") for theirs, ours in _UPSTREAM_COLUMNS.items()},
    })


def load_routellm_mmlu(path: str | os.PathLike | None = None, keep_contaminated: bool = False) -> datasets.Dataset:
    """Load RouteLLM's MMLU results: per question, whether GPT-4-1106 and Mixtral-8x7B answered it correctly.

    One `Dataset` (MMLU's test questions have no train/test split here: experiments cross-fit, see
    `research.mmlu_routing`), rows ordered by subject (alphabetically) and then as in RouteLLM's CSV of
    that subject. Like RouteLLM's evaluation (`routellm/evals/benchmarks.py`), the rows whose `prompt` is one of the
    5 contaminated prompts (`eval_prompt` in `contaminated_prompts.jsonl`) are dropped, leaving 14,037 of 14,042.

    Args:
        path (`str` or `os.PathLike`, *optional*):
            A local copy of RouteLLM's `routellm/evals/mmlu/` folder (`responses/mmlu_<subject>.csv`, optionally
            `contaminated_prompts.jsonl`), e.g. with responses of other models in the same two columns. Defaults to
            the copy shipped in the package (Apache-2.0, checked against the upstream SHA-256 of every file).
        keep_contaminated (`bool`, *optional*, defaults to `False`):
            Keep the 5 contaminated rows and add a boolean column `contaminated` that marks them.

    Returns:
        `datasets.Dataset` with columns `prompt` (the question, its options A-D and `Answer:`; no answer key, no few-shot examples), `subject`
        (e.g. `"abstract_algebra"`, 57 subjects), `gpt-4-1106-preview` and `mixtral-8x7b-instruct` (bool: was that
        model's answer correct), and `contaminated` when `keep_contaminated=True`.

    Raises:
        FileNotFoundError: `path` has no response files.
        OSError: the shipped copy is damaged (a checksum does not match).
        ValueError: a correctness column that is not booleans or 0/1, missing columns, or a bad `keep_contaminated`.

    Example:

    ```python
    >>> from hf_defer.data import load_routellm_mmlu
    >>> ds = load_routellm_mmlu()
    >>> ds.num_rows, len(set(ds["subject"]))
    (14037, 57)
    >>> round(sum(ds["gpt-4-1106-preview"]) / ds.num_rows, 4), round(sum(ds["mixtral-8x7b-instruct"]) / ds.num_rows, 4)
    (0.8059, 0.6809)

    ```
    """
    if not isinstance(keep_contaminated, bool):
        raise ValueError(f"`keep_contaminated` must be a bool, got {keep_contaminated!r}.")
    if path is None:
        where, files = "the shipped RouteLLM MMLU results", bundled_tar_members(
            "routellm-mmlu/routellm_mmlu.tar", ROUTELLM_MMLU_MEMBER_SHA256)
    elif isinstance(path, (str, os.PathLike)) and os.fspath(path):
        directory = Path(path).expanduser()
        if not directory.is_dir():
            raise FileNotFoundError(f"`path` {os.fspath(path)!r} is not a directory; expected a copy of RouteLLM's "
                                    "routellm/evals/mmlu/ folder.")
        where, files = f"`path` {os.fspath(path)!r}", _read_directory(directory)
    else:
        raise ValueError(f"`path` must be a directory path or None, got {path!r}.")
    names = sorted(name for name in files if _RESPONSES.match(name))
    frame = pd.concat([_subject_frame(name, files[name], where) for name in names], ignore_index=True)
    contaminated_prompts: set[str] = set()
    if _CONTAMINATED in files:
        for line in files[_CONTAMINATED].decode("utf-8").splitlines():
            if line.strip():
                contaminated_prompts.add(json.loads(line)["eval_prompt"])
    contaminated = frame["prompt"].isin(contaminated_prompts).to_numpy()
    if keep_contaminated:
        frame["contaminated"] = contaminated
    else:
        frame = frame[~contaminated].reset_index(drop=True)
    features = datasets.Features({
        "prompt": datasets.Value("string"),
        "subject": datasets.Value("string"),
        ROUTELLM_MMLU_STRONG: datasets.Value("bool"),
        ROUTELLM_MMLU_WEAK: datasets.Value("bool"),
        **({"contaminated": datasets.Value("bool")} if keep_contaminated else {}),
    })
    return datasets.Dataset.from_pandas(frame, features=features, preserve_index=False)
