"""Runs llama.cpp (through `llama-cpp-python`) on a GGUF file and writes the
logits of every prompt position in the layout of the hf-tiny fixtures'
`reference.json`: the last position's logits in full and the top five of
every position. An independent reference for Ferrum's GGUF path.

    python scripts/llama_cpp_logits.py MODEL.gguf REFERENCE.json OUT.json

REFERENCE.json supplies `input_ids` (the fixture's prompt). K/V are kept in
f32 so the comparison measures the model code, not cache rounding.
"""
import json
import sys

import llama_cpp
import numpy as np


def main(model, reference, out):
    ids = json.load(open(reference))["input_ids"]
    llm = llama_cpp.Llama(model_path=model, n_ctx=64, logits_all=True, verbose=False,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
                          n_threads=2, n_batch=64)
    llm.eval(ids)
    scores = np.array(llm.scores[: len(ids)], dtype=np.float64)
    top = []
    for row in scores:
        best = np.argsort(-row, kind="stable")[:5]
        top.append({"ids": [int(i) for i in best], "logits": [float(row[i]) for i in best]})
    json.dump({"source": f"llama-cpp-python {llama_cpp.__version__}", "input_ids": ids,
               "logits_last": [float(v) for v in scores[-1]], "logits_all_top5": top},
              open(out, "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
