#!/usr/bin/env python3
"""Fixtures for data/bpe.c from the Hugging Face `tokenizers` library itself, on a host where it is
installed: two byte-level BPE tokenizers trained by its BpeTrainer on a text (GPT-2's ByteLevel
pre-tokenizer; Llama 3's Split pattern with ByteLevel and ignore_merges), the ids it gives the
texts of tests/fixtures/bpe/cases.txt, and the time it takes to encode the whole text on one
thread (the figure build/prepare --tokenizer is compared with).

    python3 scripts/tools/bpe_hf_fixtures.py TEXT OUT_DIR [--vocab 657]

Writes OUT_DIR/hf_gpt2_style.json, hf_gpt2_cases.json, hf_llama3_style.json, hf_llama3_cases.json
(the cases as tests/tools/bpe_reference.py writes them: [{"text": ..., "ids": [...]}, ...]) and
prints, per tokenizer, the encoding time and speed.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "tools"))
from bpe_reference import LLAMA3, unescape  # noqa: E402

EOT = "<|endoftext|>"


def build(style):
    tok = Tokenizer(models.BPE(ignore_merges=style == "llama3"))
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("text")
    p.add_argument("out_dir")
    p.add_argument("--vocab", type=int, default=657)
    a = p.parse_args()
    cases_path = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "bpe", "cases.txt")
    cases = [unescape(c) for c in open(cases_path, encoding="utf-8").read().split("\n%%\n") if c]
    text = open(a.text, encoding="utf-8").read()
    os.makedirs(a.out_dir, exist_ok=True)
    for style in ("gpt2", "llama3"):
        tok = build(style)
        trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=[EOT], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train([a.text], trainer)
        tok.save(os.path.join(a.out_dir, f"hf_{style}_style.json"))
        out = [{"text": c, "ids": tok.encode(c, add_special_tokens=False).ids} for c in cases]
        json.dump(out, open(os.path.join(a.out_dir, f"hf_{style}_cases.json"), "w", encoding="utf-8"),
                  ensure_ascii=False, indent=0)
        t0 = time.perf_counter()
        n = len(tok.encode(text, add_special_tokens=False).ids)
        s = time.perf_counter() - t0
        print(f"{style}: tokenizers encoded {len(text.encode('utf-8'))} bytes into {n} tokens in {s:.3f} s on one "
              f"thread ({len(text.encode('utf-8')) / s / 1e6:.1f} MB/s)")


if __name__ == "__main__":
    main()
