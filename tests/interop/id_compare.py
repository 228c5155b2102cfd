"""Counts the documents whose token ids differ between megatrain and a Python reference tokenizer, printing the
first few differences (where they start, and the text), for the tokenizer interop checks."""


def count_mismatches(name, ours, theirs, texts, reference_name, near=None):
    """ours, theirs: lists of id lists, one per document; near(ids) -> str shows the reference's text around a
    difference (optional). Returns (documents, tokens, mismatching documents)."""
    if len(ours) != len(theirs):
        print(f"{name}: {len(ours)} documents from megatrain, {len(theirs)} expected")
        return len(theirs), 0, len(theirs)
    mismatches = 0
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a == b:
            continue
        mismatches += 1
        if mismatches <= 3:
            k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
            around = f" near {near(b[max(0, k - 3):k + 3])!r}" if near else ""
            print(f"{name}: document {i} differs at token {k}: megatrain {a[k:k + 6]} {reference_name} "
                  f"{b[k:k + 6]}{around}; text {texts[i][:120]!r}")
    tokens = sum(len(t) for t in theirs)
    print(f"{name}: {len(theirs)} documents, {tokens} tokens, {mismatches} mismatches")
    return len(theirs), tokens, mismatches
