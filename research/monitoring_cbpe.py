"""NannyML's CBPE on the streams of `results/monitoring.md`, run in NannyML's own virtualenv (nannyml 0.13 pins
what the training stack does not: lightgbm, FLAML, plotly...), so this file imports neither hf_defer nor research.

CBPE (confidence-based performance estimation) estimates a classifier's accuracy without labels from its predicted
probabilities, recalibrated on a labelled reference set. Here the "classifier" is the deferral system and the
probability is its estimated chance of being right on each input (the model's own: the classifier's top probability
where it answers, the chosen expert's estimated accuracy where it defers); the prediction is "right" (1) everywhere,
so accuracy is one minus the system error. The reference set is the calibration inputs (labelled); each stream's
windows are CBPE's chunks.

Usage: python research/monitoring_cbpe.py STREAMS.npz OUT.json   (keys: `<scenario>/ref_p`, `/ref_y`, `/p`, `/y`,
`/window`: reference scores and truths, the streams' scores and truths `[streams, rows]`)
"""

from __future__ import annotations

import json
import sys

import numpy as np


def main(source: str, target: str) -> None:
    import nannyml as nml
    import pandas as pd

    data = np.load(source)
    scenarios = sorted({key.split("/")[0] for key in data.files})
    out = {"nannyml": nml.__version__, "estimates": {}}
    for scenario in scenarios:
        window = int(data[f"{scenario}/window"])
        reference = pd.DataFrame({"p": data[f"{scenario}/ref_p"], "y_true": data[f"{scenario}/ref_y"].astype(int)})
        reference["y_pred"] = 1
        estimator = nml.CBPE(problem_type="classification_binary", y_pred_proba="p", y_pred="y_pred",
                             y_true="y_true", metrics=["accuracy"], chunk_size=window)
        estimator.fit(reference)
        p = data[f"{scenario}/p"]
        analysis = pd.DataFrame({"p": p.reshape(-1)})
        analysis["y_pred"] = 1
        result = estimator.estimate(analysis).filter(period="analysis").to_df()
        accuracy = result[("accuracy", "value")].to_numpy()
        rows = p.shape[1] // window
        out["estimates"][scenario] = (1.0 - accuracy[: p.shape[0] * rows]).reshape(p.shape[0], rows).tolist()
    with open(target, "w") as handle:
        json.dump(out, handle)


if __name__ == "__main__":
    main(*sys.argv[1:3])
