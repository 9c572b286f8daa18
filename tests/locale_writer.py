"""Write what a Chinese learner's session writes, into OUT, and a digest of every file there (tests/test_locale_gbk.py).

    python tests/locale_writer.py OUT COURSE

Run once under zh_CN.GBK and once under C.UTF-8: the two digests must be equal. It writes, in folders whose names
have spaces and Chinese characters: the working copy of both editions of COURSE (a frozen copy of notebooks/, so
that both runs see the same chapters) with JupyterLab's Chinese setting (transformer_lab.workspace), a text of Tang
poems that includes characters GBK lacks, a byte-level BPE trained on it by `tl-bpe train`, its ids and decoded
text (`tl-bpe encode` / `decode`), a tiny GPT trained on it with that tokenizer by `transformer-lab gpt-train`, and
a sample with a Chinese prompt (`gpt-sample`). What the commands print is captured and saved as UTF-8. The digest,
OUT/digest.json, names each file by its path (as this process decodes it) and gives its SHA-256; a checkpoint is
given by what it holds (tensors by their SHA-256), not its bytes, since torch.save writes a fresh serialization id
each time.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys
from pathlib import Path

import torch

from transformer_lab import bpe_cli, cli, workspace
from transformer_lab.data import load_corpus


def gbk_lacks(text: str) -> bool:
    try:
        text.encode("gbk")
    except UnicodeEncodeError:
        return True
    return False


def captured(main, argv: list[str]) -> str:  # noqa: ANN001 - a command's main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    assert status == 0, (argv, status)
    return out.getvalue()


def canonical(value: object) -> object:
    """A checkpoint's contents as JSON-able data: tensors by dtype, shape and the SHA-256 of their bytes; measured
    times left out."""
    if isinstance(value, torch.Tensor):
        data = value.detach().contiguous().cpu()
        raw = data.view(torch.uint8).numpy().tobytes() if data.numel() else b""
        return {"dtype": str(data.dtype), "shape": list(data.shape), "sha256": hashlib.sha256(raw).hexdigest()}
    if isinstance(value, dict):  # measured times (`seconds`, `eval_seconds`) aside: they differ on every run
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        return {str(k): canonical(v) for k, v in items if not str(k).endswith("seconds")}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return value


def digest(out: Path) -> dict[str, object]:
    files = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        name = path.relative_to(out).as_posix()
        if path.suffix == ".pt":
            files[name] = canonical(torch.load(path, weights_only=True))
        else:
            files[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def main(out: Path, course: Path) -> None:
    torch.set_num_threads(1)
    folder = out / "张三 的 课程"
    workspace.check_folder(folder)
    workspace.sync(course, workspace.working_copy(folder, "en"))
    workspace.sync(course / "zh", workspace.working_copy(folder, "zh"))
    workspace.chinese_interface(folder)

    poems = load_corpus("tang").splitlines()
    rare = [line for line in poems if gbk_lacks(line)][:20]
    text = "\n".join(poems[:200] + rare) + "\n"
    assert gbk_lacks(text), "the sample must hold characters GBK lacks"
    corpus = out / "唐诗 样本.txt"
    corpus.write_text(text, encoding="utf-8")

    tokenizer = out / "分词器 一"
    captured(
        bpe_cli.main,
        ["train", "--corpus", str(corpus), "--vocab-size", "320", "--split", "all", "--out", str(tokenizer)],
    )
    sample = out / "样本 一句.txt"
    sample.write_text(rare[0] + "\n", encoding="utf-8")
    ids = captured(bpe_cli.main, ["encode", str(tokenizer), "--file", str(sample)])
    (out / "编号.txt").write_text(ids, encoding="utf-8")
    decoded = captured(bpe_cli.main, ["decode", str(tokenizer), "--file", str(out / "编号.txt")])
    assert decoded == rare[0] + "\n" + "\n", (decoded, rare[0])
    (out / "解码.txt").write_text(decoded, encoding="utf-8")

    model = out / "模型 一.pt"
    tiny = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--block-size", "16", "--batch-size", "4"]
    short = ["--steps", "4", "--warmup", "2", "--eval-every", "2", "--no-progress"]
    train = ["gpt-train", "--text", str(corpus), "--tokenizer", str(tokenizer), *tiny, *short, "--seed", "1"]
    captured(cli.main, [*train, "--out", str(model)])
    said = captured(cli.main, ["gpt-sample", str(model), "--prompt", "床前明月光", "--length", "12", "--seed", "3"])
    (out / "续写.txt").write_text(said, encoding="utf-8")

    files = digest(out)
    (out / "digest.json").write_text(json.dumps(files, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
