"""Compares `megatrain data prepare --format chat` with transformers' apply_chat_template, conversation by
conversation, for the ChatML and Llama 3 templates.

A tiny byte-level BPE is trained here with the `tokenizers` package (offline), given each template's special tokens
and saved with a tokenizer_config.json that holds the template (the Qwen2-style ChatML one without its default
system prompt, and Meta-Llama-3-Instruct's), so megatrain finds it with --chat-template auto. For every conversation,
megatrain's tokens must equal apply_chat_template(messages, tokenize=True), and the tokens its loss mask marks must
decode to each assistant message's content followed by the turn's end token.
Usage: check_chat_template.py MEGATRAIN WORKDIR"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from indexed_file import read_indexed  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
          "{% endif %}")
TEMPLATES = {
    "chatml": (CHATML, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", {}),
    "llama3": (LLAMA3, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|eot_id|>"], "<|eot_id|>", {"bos_token": "<|begin_of_text|>"}),
}

CONVERSATIONS = [
    {"prompt": "What is 2+2?", "response": "4"},
    {"messages": [{"role": "system", "content": "You answer in French."},
                  {"role": "user", "content": "Hello, how are you?"},
                  {"role": "assistant", "content": "Très bien, merci !"},
                  {"role": "user", "content": "And the weather?\n\nBe brief."},
                  {"role": "assistant", "content": "  Il pleut.\n"}]},
    {"messages": [{"role": "user", "content": "Write code:\n```\nfor i in range(3): print(i)\n```"},
                  {"role": "assistant", "content": "def f(x):\n    return x * 2  # doubled\n"}]},
    {"messages": [{"role": "user", "content": "Emoji? 🙂 漢字 ünïcödé"}, {"role": "assistant", "content": ""}]},
    {"prompt": " leading and trailing spaces ", "response": "\tTabs\tand\nnewlines\n\n"},
]

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def f(x):\n    return x * 2\nfor i in range(10): print(i)\n",
    "Très bien, merci ! Il pleut. Bonjour, comment allez-vous ?",
    "Hello, how are you? What is 2+2? The weather is fine; be brief.",
    "🙂 漢字 ünïcödé 12345 <>[]{}()",
]


def messages_of(line):
    if "messages" in line:
        return line["messages"]
    return [{"role": "user", "content": line["prompt"]}, {"role": "assistant", "content": line["response"]}]


def build(name, directory):
    template, specials, _, extra = TEMPLATES[name]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
              "eos_token": TEMPLATES[name][2], "model_max_length": 4096, **extra}
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


def input_ids(encoded):
    # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True); 4.x a list of ids.
    if hasattr(encoded, "keys") and "input_ids" in encoded:
        encoded = encoded["input_ids"]
    return list(encoded)


def main():
    megatrain, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    chat = os.path.join(work, "chat.jsonl")
    with open(chat, "w") as f:
        for line in CONVERSATIONS:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    failures = 0
    for name in TEMPLATES:
        directory = os.path.join(work, name)
        build(name, directory)
        prefix = os.path.join(work, name + "-sft")
        subprocess.run([megatrain, "data", "prepare", "--input", chat, "--output", prefix, "--tokenizer", "hf",
                        "--tokenizer-file", os.path.join(directory, "tokenizer.json"), "--format", "chat"],
                       check=True)
        hf = AutoTokenizer.from_pretrained(directory)
        tokens, mask = read_indexed(prefix), read_indexed(prefix + "_mask")
        assert len(tokens) == len(CONVERSATIONS) == len(mask)
        end = TEMPLATES[name][2]
        for d, line in enumerate(CONVERSATIONS):
            messages = messages_of(line)
            want = input_ids(hf.apply_chat_template(messages, tokenize=True))
            if tokens[d] != want:
                failures += 1
                print(f"{name} conversation {d}: megatrain {tokens[d]}\n  transformers {want}")
                continue
            learned = [t for t, m in zip(tokens[d], mask[d]) if m]
            answers = "".join((m["content"].strip() if name == "llama3" else m["content"]) + end
                              for m in messages if m["role"] == "assistant")
            got = hf.decode(learned, skip_special_tokens=False)
            if got != answers:
                failures += 1
                print(f"{name} conversation {d}: the mask learns {got!r}, expected {answers!r}")
        print(f"{name}: {len(CONVERSATIONS)} conversations, {failures} mismatches so far")
    print(f"total: {failures} mismatches")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
