"""A varied, seeded corpus for the tokenizer interop tests: many scripts, emoji (ZWJ sequences, skin tones,
flags, keycaps), whitespace runs, tabs/newlines/CR, control characters, numbers, contractions, very long
words, special-token look-alikes and, in some documents, invalid UTF-8.

documents(seed, count) -> list of bytes. Standard library only."""
import random

FRAGMENTS = [
    "The quick brown fox jumps over the lazy dog.", "I'm sure you'll see they've gone; she'd said it's fine.",
    "DON'T SHOUT, IT'S LOUD. We'D, y'all'Re, o'clock", "rock'n'roll isn't dead", "'s 't 're 've 'm 'll 'd",
    "Straße, Grüße, Äpfel und Öl kosten 3,50 €.", "Ça va? L'été dernier, où étiez-vous?",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.", "Ξεσκεπάζω τὴν ψυχοφθόρα βδελυγμία.",
    "我能吞下玻璃而不伤身体。", "いろはにほへと ちりぬるを カタカナ 漢字", "다람쥐 헌 쳇바퀴에 타고파",
    "نص حكيم له سر قاطع وذو شأن عظيم", "דג סקרן שט בים מאוכזב", "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम",
    "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า", "Tiếng Việt có dấu: người, được, những", "ſtate ſ ﬁ ﬂ Ǆ ǅ K Å",
    "😀 😃 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇩🇪 1️⃣ #️⃣ 🧑🏿‍🚀 ❤️‍🔥", "emoji🙂glued🙃to😉words",
    "12345678901234567890", "3.14159 2.71828 -42 +7 1e-9 0x1F 1,000,000 ٣٤٥ ²³ ½ Ⅻ ①②", "In 2024, 99% of 7,000 users",
    "def f(x):\n\treturn x ** 2  # square\n", "if (a && b) { c->d[i] = *p++; }", "https://example.com/a?b=c&d=e#f",
    "!!!??? ... --- *** ___ ~~~ ``` \"quoted\" (paren) [bracket] {brace}", "a.b,c;d:e!f?g", "C:\\path\\to\\file.txt",
    "<|endoftext|>", "text<|endoftext|>more", "<|begin_of_text|>hello<|end_of_text|>", "<|reserved_special_token_3|>",
    "<|end_of", "[[tool]] call [[tool]][[tool]]", "<s> </s> <unk> <pad>",
    "a <mask> b  \t<mask>\u3000<mask>x<mask>", "[[sw]] x[[sw]] [[sw]]y é[[sw]] _[[sw]]! ([[sw]])", "<r>  \n z <r>x<r>\u00a0<r><r>",
    # Where Oniguruma's \s (White_Space) and PCRE2's differ (U+180E) and near-misses (U+0085, U+001C, U+200B).
    "end!\u0085next ?\x1c !\u2028 !\u200b word\u0085 \u0085\u0085x \u0085\n\nline wait!\u180e!\u180e go",
]
# For the normalizers (NFC/NFD/NFKC/NFKD, Lowercase, Strip): case mappings that differ between simple and full
# lowercasing or depend on context (Turkish dotted I, Greek final sigma, titlecase digraphs), compatibility and
# canonical equivalents, combining-mark order, Hangul. Extra documents, not fragments, so that adding here does not
# change the generated corpora (nor the tokenizers trained on them).
NORMALIZATION_CASES = [
    "İstanbul Iİıi DİYARBAKIR", "ΟΔΟΣ ΚΑΙ ΣΟΦΙΑ Σ ΑΣ. ὈΔΥΣΣΕΎΣ ΣΑΣ", "ǄUNGLA ǅungla ǈ ǋ ß ẞ ŉ ΐ ﬀ ﬃ",
    "Å Å Å é é ñ ñ", "K Ω Ω ℃ ™ ㎏ ℡ Ⅻ ⓐ ①", "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３ ｶﾀｶﾅ",
    "a\u0323\u0307 a\u0307\u0323 q\u0307\u0323 \u1e0b\u0323", "\u1100\u1161\u11a8 각 \uac00\u11a8",
    "Ꭰ Ꮼ ꭰ Ⴀ ⴀ Ა", "  \t leading and trailing \u3000\u00a0 ", "\u0085\u2028 x \u180e", "[[TOOL]] [[Tool]] <MASK> <mask>",
    " <MASK>  [[tool]]\t<r>  é<r>Ü", "Ⅰ Ⅱ ⅰ Ⓐ ⓐ 🄰 Ǳ ǲ ǳ ᾈ ᾀ ῼ", "ΣΑΣ ΣΑΣ. σας ὅς ΌΣ,Σ",
]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028", "\u2029",
          "\u0085", "\u0085\n", "\u180e", "\u200b", "\ufeff", "\x0b", "\x0c", "\x1c\x1d\x1e\x1f", "        \n", " \t \n"]
CONTROLS = ["\x00", "\x01", "\x07", "\x1b[31mred\x1b[0m", "\x7f", "\u0080", "\u009f", "\u202e", "\u00ad"]
INVALID = [b"\xff", b"\xfe", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf",
           b"\xf4\x90\x80\x80", b"\xf5\x80", b"\x80\x80\x80", b"\xf0\x9f\x98", b"\xe2\x28\xa1", b"\xf8\x88\x80\x80\x80"]
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZéßжλ中ㅎ"


def long_word(rng):
    kind = rng.randrange(5)
    n = rng.choice([300, 700, 2000, 5000])
    if kind == 0:
        return "a" * n
    if kind == 1:
        return "".join(rng.choice(LETTERS) for _ in range(n))
    if kind == 2:
        return "".join(rng.choice("0123456789") for _ in range(n))
    if kind == 3:
        return rng.choice([" ", "\t", "\n"]) * n
    return "!?" * (n // 2)


def document(rng, allow_invalid):
    parts = []
    for _ in range(rng.randrange(1, 12)):
        r = rng.random()
        if r < 0.55:
            s = rng.choice(FRAGMENTS)
            if rng.random() < 0.2:
                s = s.upper() if rng.random() < 0.5 else s.lower()
            parts.append(s.encode())
        elif r < 0.75:
            parts.append(rng.choice(SPACES).encode())
        elif r < 0.85:
            parts.append(rng.choice(CONTROLS).encode())
        elif r < 0.9:
            parts.append(long_word(rng).encode())
        elif r < 0.95 and allow_invalid:
            parts.append(rng.choice(INVALID))
        else:
            parts.append(bytes([rng.randrange(0x20, 0x7f)]) * rng.randrange(1, 5))
        if rng.random() < 0.6:
            parts.append(rng.choice([" ", " ", "\n", ""]).encode())
    return b"".join(parts)


def documents(seed, count, invalid_fraction=0.2, max_bytes=None):
    """`count` documents; the first few are edge cases (empty, blank, one invalid byte). With max_bytes, longer
    documents are drawn again (small golden corpora)."""
    rng = random.Random(seed)
    docs = [b"", b" ", b"\n", "Hello world".encode(), b"\xff"] if invalid_fraction > 0 else [b"", b" ", b"Hello"]
    while len(docs) < count:
        d = document(rng, rng.random() < invalid_fraction)
        if max_bytes is None or len(d) <= max_bytes:
            docs.append(d)
    return docs[:count]


def jsonl_line(doc):
    """One JSON line {"text": ...} for a document of arbitrary bytes: valid text is JSON-escaped as usual, invalid
    bytes are written raw (megatrain's JSONL reader passes them through to the tokenizer)."""
    import json
    text = doc.decode("utf-8", "surrogateescape")
    return json.dumps({"text": text}, ensure_ascii=False).encode("utf-8", "surrogateescape") + b"\n"


def write_jsonl(path, docs):
    """Writes docs (bytes) as JSON lines to path (see jsonl_line) and returns path."""
    with open(path, "wb") as f:
        for d in docs:
            f.write(jsonl_line(d))
    return path


def as_python_text(doc):
    """What the Python tokenizers see: invalid UTF-8 replaced by U+FFFD, as megatrain does (core/tokenizer/utf8.h)."""
    return doc.decode("utf-8", "replace")
