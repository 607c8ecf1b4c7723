"""A small Gemma-style tokenizer for the random-weight fixtures (used by make_checkpoints.py).

The real Gemma 4 tokenizer is a SentencePiece-style BPE serialized for HF `tokenizers`:
normalizer Replace(" " -> "\u2581"), pre-tokenizer Split(" ", merged_with_previous), BPE with
byte_fallback (tokens "<0x00>".."<0xFF>") and fuse_unk, decoder Replace("\u2581" -> " ") +
ByteFallback + Fuse. transformers 5's `GemmaTokenizer` rebuilds exactly these components from the
file's vocab/merges when it loads (only the post-processor is taken from the file), so the fixture
must use them too, or the reference and a reader of tokenizer.json would tokenize differently.
The reference picks its streaming detokenizer from the decoder shape (this one selects
`SPMStreamingDetokenizer(trim_space=False)`, as the real model does).

Layout of the fixture vocabulary (size = model vocab):
- Gemma's special ids where they fit: <pad>=0, <eos>=1, <bos>=2, <unk>=3, <mask>=4, the tool
  tokens 46-52, <|think|>=98, <|channel>=100, <channel|>=101, <|turn>=105, <turn|>=106.
- The multimodal tokens at the top, in the real model's relative order: <|image>=V-7 (boi),
  <|audio>=V-6, <|image|>=V-5 (image), <|audio|>=V-4, <image|>=V-3 (eoi), <audio|>=V-2,
  <|video|>=V-1 (transformers' Gemma4Processor adds <|video|> when missing, which would grow the
  vocab past the model's, so it is present).
- The 256 byte-fallback tokens right below the multimodal block.
- Every other id: pieces learned by a BPE trainer on the small embedded corpus below (English,
  accented Latin, Greek, Cyrillic, CJK, emoji; whatever is not learned falls back to bytes).
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

SPACE = "\u2581"
ALPHABET_SIZE = 80

CORE_SPECIALS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>"}
CONTROL_SPECIALS = {
    46: "<|tool>",
    47: "<tool|>",
    48: "<|tool_call>",
    49: "<tool_call|>",
    50: "<|tool_response>",
    51: "<tool_response|>",
    52: '<|"|>',
    98: "<|think|>",
    100: "<|channel>",
    101: "<channel|>",
    105: "<|turn>",
    106: "<turn|>",
}
# Offsets from the vocab size, in the real model's relative order.
MULTIMODAL_FROM_TOP = {
    7: "<|image>",
    6: "<|audio>",
    5: "<|image|>",
    4: "<|audio|>",
    3: "<image|>",
    2: "<audio|>",
    1: "<|video|>",
}

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! This is a tiny tokenizer for testing a diffusion language model.",
    "A model reads the prompt into a cache, then denoises a canvas of tokens in parallel.",
    "Why is the sky blue? Because air scatters short wavelengths of sunlight more than long ones.",
    "Write a short poem about the sea, the wind and the stars at night.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2026 3.14159",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    '{"name": "tiny", "layers": 6, "hidden": 64, "ok": true}',
    "Once upon a time there was a little robot who wanted to learn how to write stories.",
    "The encoder is causal; the decoder attends to itself and to the cached prompt.",
    "Please answer the question in one sentence, and then explain your reasoning step by step.",
    "Café, naïve, résumé, über, Straße, señor, déjà vu, crème brûlée.",
    "Français: le chat est sur la table. Deutsch: Der Hund schläft im Garten.",
    "Español: ¿Dónde está la biblioteca? Português: Obrigado pela ajuda!",
    "Ελληνικά: καλημέρα κόσμε. Русский: привет, мир! Українська: дякую.",
    "日本語: こんにちは世界。中文: 你好，世界。한국어: 안녕하세요.",
    "Emoji: 🙂 🚀 🌍 ✨ — and symbols: © ® ™ € £ ¥ ° ± × ÷ → ←",
    "the the the and and of of to to in in is is it it that that for for with with",
    "tokens tokens model model canvas canvas prompt prompt cache cache layer layer",
    "In the beginning the universe was created. This has made a lot of people very angry.",
    "Some text\twith tabs\tand\nnew lines\n\nand double spaces  here.",
]


def _learned_pieces(n_learned: int) -> tuple[list[str], list[tuple[str, str]]]:
    """A plain, deterministic BPE trainer (tokenizers' BpeTrainer breaks count ties in hash
    order, so its output changes between runs). Words are split before each U+2581, as
    SentencePiece does; the alphabet is the ALPHABET_SIZE most frequent characters (rarer ones
    stay unmerged and fall back to bytes); each step merges the most frequent adjacent pair,
    ties to the lexicographically smallest. Returns the pieces (alphabet, then merge results in
    merge order) and the merges."""
    words: dict[tuple[str, ...], int] = {}
    chars: dict[str, int] = {}
    for line in CORPUS:
        text = line.replace(" ", SPACE)
        starts = [0] + [i for i, ch in enumerate(text) if ch == SPACE and i > 0]
        for a, b in zip(starts, starts[1:] + [len(text)]):
            word = tuple(text[a:b])
            words[word] = words.get(word, 0) + 1
            for ch in word:
                chars[ch] = chars.get(ch, 0) + 1
    alphabet = sorted(chars, key=lambda ch: (-chars[ch], ch))[:ALPHABET_SIZE]
    if SPACE not in alphabet:
        alphabet[-1] = SPACE
    known = set(alphabet)
    pieces = list(alphabet)
    merges: list[tuple[str, str]] = []
    while len(pieces) < n_learned:
        counts: dict[tuple[str, str], int] = {}
        for word, freq in words.items():
            for pair in zip(word, word[1:]):
                if pair[0] in known and pair[1] in known:
                    counts[pair] = counts.get(pair, 0) + freq
        if not counts:
            break
        best = min(counts, key=lambda pair: (-counts[pair], pair))
        merged = best[0] + best[1]
        merges.append(best)
        if merged not in known:
            known.add(merged)
            pieces.append(merged)
        new_words: dict[tuple[str, ...], int] = {}
        for word, freq in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            key = tuple(out)
            new_words[key] = new_words.get(key, 0) + freq
        words = new_words
    return pieces, merges


def build_tokenizer(vocab_size: int) -> tuple[Tokenizer, dict[str, int]]:
    """Build the fixture tokenizer; return it and the ids of the named special tokens."""
    specials: dict[int, str] = dict(CORE_SPECIALS)
    specials.update(CONTROL_SPECIALS)
    for off, name in MULTIMODAL_FROM_TOP.items():
        specials[vocab_size - off] = name
    assert all(0 <= i < vocab_size for i in specials), "special ids must fit in the vocab"

    byte_start = vocab_size - max(MULTIMODAL_FROM_TOP) - 256
    byte_ids = {byte_start + b: f"<0x{b:02X}>" for b in range(256)}
    assert not set(byte_ids) & set(specials)

    free_ids = [i for i in range(vocab_size) if i not in specials and i not in byte_ids]
    pieces, merges = _learned_pieces(len(free_ids))
    # If the trainer ever stops short of the requested size (a smaller corpus), fill the rest with
    # distinct <unusedN> tokens, as Gemma's vocab has, so every id stays defined.
    pieces = [p for p in pieces if p not in byte_ids.values()]
    if len(pieces) > len(free_ids):
        raise ValueError(f"trainer returned {len(pieces)} pieces for {len(free_ids)} free ids")
    n_unused = len(free_ids) - len(pieces)
    pieces = pieces + [f"<unused{i}>" for i in range(n_unused)]

    vocab: dict[str, int] = {}
    for i, name in specials.items():
        vocab[name] = i
    for i, name in byte_ids.items():
        vocab[name] = i
    for i, piece in zip(free_ids, pieces):
        assert piece not in vocab, piece
        vocab[piece] = i
    assert len(vocab) == vocab_size and sorted(vocab.values()) == list(range(vocab_size))

    tok = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            unk_token="<unk>",
            fuse_unk=True,
            byte_fallback=True,
            dropout=None,
        )
    )
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    added = [
        AddedToken(specials[i], special=True, normalized=False, lstrip=False, rstrip=False)
        for i in sorted(specials)
    ]
    unused = [
        AddedToken(p, special=False, normalized=False) for p in pieces if p.startswith("<unused")
    ]
    tok.add_special_tokens(added)
    if unused:
        tok.add_tokens(unused)
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()

    ids = {name: i for i, name in specials.items()}
    return tok, ids
