"""Times llama.cpp (through `llama-cpp-python`) like `ferrum bench`: a prompt of random
token ids evaluated at once (pp), then single tokens (tg), per round.

    python scripts/llama_cpp_bench.py MODEL.gguf N_PROMPT N_GEN ROUNDS
"""
import sys, time
import llama_cpp
path, n_prompt, n_gen, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=2, n_threads_batch=2, n_batch=512, verbose=False)
import random
random.seed(1)
for r in range(reps):
    toks = [random.randrange(300, 150000) for _ in range(n_prompt)]
    llm.reset()
    t0 = time.time(); llm.eval(toks); tp = time.time() - t0
    t0 = time.time()
    for i in range(n_gen):
        llm.eval([random.randrange(300, 150000)])
    tg = time.time() - t0
    print(f"rep {r}: pp{n_prompt} {n_prompt/tp:.2f} tok/s, tg{n_gen} {n_gen/tg:.2f} tok/s", flush=True)
