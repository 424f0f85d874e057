#!/usr/bin/env python3
"""Reference fixtures for the tokenizer (tests/test-tok.c, tests/t1100-tokenize.sh).

Builds test strings and a set of tokenizers with the Hugging Face `tokenizers`
library, and writes what the library makes of every string under
tests/fixtures/tok/:

  strings.jsonl            one JSON string per line (the inputs)
  <name>.json              the tokenizer (not for "init": the test makes that
                           one with `hi3 init-model --preset tiny`)
  <name>.expected.jsonl    per string: [ids, plain_ids, decoded, decoded_skip]
                           ids: special tokens recognised; plain_ids: with
                           encode_special_tokens (null when equal to ids);
                           decoded: decode(ids) keeping special tokens, and
                           decoded_skip: dropping them (null when equal to the
                           input string, resp. to decoded)
  <name>.decode.jsonl      [ids, text, text_skip] for random id sequences
                           (partial UTF-8 included)
  init.ids.jsonl           the "init" ids alone, for the shell test
  classes.jsonl            code points for the class-* tokenizers, which keep
                           only what one regex class matches
  tokenizers.txt           the list test-tok walks

Usage: HI3=bin/hi3 make_tok_fixtures.py --out tests/fixtures
"""
import os
os.environ.setdefault("RAYON_NUM_THREADS", "1")   # deterministic training
import argparse
import glob
import gzip
import json
import random
import re
import subprocess
import sys
import tempfile

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers as pt
from tokenizers import trainers

GPT4_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_SPLITS = [r"[\r\n]", r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽ"
                   "Ა-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭ"
                   r"ℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲"
                   r"𑢠-𑣟𞤀-𞥃]+", r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}+"]

# The special tokens of hi3-batching(7), SEQUENCE TEMPLATE (as hi3 init-model names them).
SPECIALS = (["<|startoftext|>", "<|endoftext|>", "<pad>", "<boi>", "<eoi>", "<img>", "<cfg>", "<joint_img_sep>",
             "<timestep>", "<guidance>", "<answer>", "</answer>", "<think>", "</think>", "<recaption>",
             "</recaption>"] + ["<img_size_%d>" % s for s in (256, 512, 768, 1024, 1280, 1536, 2048)]
            + ["<img_ratio_%d>" % i for i in range(33)])

MULTILINGUAL = """\
The quick brown fox jumps over the lazy dog. It's not what you'd think; we'll see, they've gone.
敏捷的棕色狐狸跳过了懒狗。今天天气很好，我们去公园散步吧。机器学习模型需要大量数据。
素早い茶色の狐が怠け者の犬を飛び越える。東京は日本の首都です。カタカナとひらがな。
빠른 갈색 여우가 게으른 개를 뛰어넘습니다. 안녕하세요 세계.
الثعلب البني السريع يقفز فوق الكلب الكسول. مرحبا بالعالم، كيف حالك اليوم؟
השועל החום המהיר קופץ מעל הכלב העצלן. שלום עולם, מה שלומך?
Быстрая коричневая лиса прыгает через ленивую собаку. Привет, мир!
Η γρήγορη καφέ αλεπού πηδά πάνω από το τεμπέλικο σκυλί. Γειά σου κόσμε.
तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है। नमस्ते दुनिया।
Tiếng Việt có dấu: Xin chào thế giới, cảm ơn bạn rất nhiều.
Emoji 😀😃😄 👍🏽 🇯🇵🇺🇸 👨‍👩‍👧‍👦 🏳️‍🌈 and numbers 1234567890 3.14159 1,000,000.
"""


# ------------------------------------------------------------------ strings

def make_strings():
    s = [
        "", " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n\n", "\r\n", "\r\n\r\n", "\r", " \n ", "a\r\nb",
        "a  \n  b", " leading", "trailing ", "  both  ", "a\tb\tc", "x \t \n y", "\u00a0", "a\u00a0b",
        "\u3000", "a\u3000b", "\u2028", "a\u2029b", "\u0085", "a\u0085b", "\u180e", "a\u180eb", "\u200b",
        "a\u200bb", "\x0b\x0c", "\x1c\x1d\x1e\x1f", "a \u2003 b",
        "Hello world", "hello world", "HELLO WORLD", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
        "I'm", "I'M", "don't", "DON'T", "Don'T", "we'll", "WE'LL", "we'Ll", "he's", "HE'S", "He'S", "they're",
        "THEY'RE", "you've", "YOU'VE", "I'd", "I'D", "'s", "'S", "''s", "x's's", "'ll'll", "rock 'n' roll",
        "it\u2019s", "\u017f's'\u017f", "'\u212a",
        "1", "12", "123", "1234", "12345", "1234567890", "3.14159", "1,000,000", "-42", "+7e10", "0x1F",
        "2024-11-30", "12:30:45", "v1.2.3", "٣٤٥", "١٢٣٤٥٦", "①②③", "Ⅻ", "x²+y²", "½", "๑๒๓", "１２３",
        "abc123def", "a1b2c3", "9" * 50,
        "你好", "你好，世界！", "中文测试：我爱北京天安门。", "日本語のテキスト", "ひらがなカタカナ", "ＡＢＣ",
        "한국어", "안녕하세요", "\u1100\u1161\u11a8", "漢字かな交じり文",
        "😀", "😀😀😀", "👍🏽", "👍🏿👍🏻", "🇯🇵", "🇺🇸🇬🇧🇫🇷", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏽‍💻", "1️⃣", "#️⃣",
        "❤️", "🧑‍🤝‍🧑", "🫠", "a😀b", "😀 😀", "emoji😀in😀text",
        "e\u0301", "cafe\u0301", "café", "a\u0308\u0301", "n\u0303", "ñ", "Z\u0351\u0308\u0324a\u0362l\u0325g\u0359o",
        "Tiếng Việt", "A\u030a", "Å", "\u212b", "ﬁ", "ﬃ", "ǅ", "İstanbul", "ΣΊΣΥΦΟΣ", "Straße", "ß",
        "مرحبا", "مرحبا بالعالم", "العربية ١٢٣", "שלום", "שלום עולם", "עברית 123", "\u200fRTL\u200e",
        "English עברית mixed", "العربية and English", "ﷺ", "ﷲ",
        "Привет", "Ελληνικά", "हिन्दी", "ไทย", "ქართული", "Հայերեն", "ᚠᚢᚦ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟙𝟚𝟛",
        "\ufffd", "\ufdd0", "\uffff", "\U0010ffff", "\ue000", "\U000f0000", "\x00", "a\x00b", "\x01\x7f",
        "\x80\x9f", "\ufeff", "\ufeffBOM", "Ã©", "â€™", "Â\xa0", "\u0300", "\u0301\u0301", "\u034f",
        "<|startoftext|>", "<|endoftext|>", "<|startoftext|>Hello<|endoftext|>", "<boi><img><img><eoi>",
        "<img_size_1024><img_ratio_3>", "x<pad>y", "<think>reason</think><answer>42</answer>",
        "<|endoftext|><|endoftext|>", "<|endoftext|", "|endoftext|>", "<img_ratio_33>", "<<boi>>",
        " <boi> ", "<recaption>a cat</recaption>", "text <joint_img_sep> text", "<timestep><guidance><cfg>",
        "<img_size_256><img_size_2048>", "<IMG>", "<img", "<|startoftext|><|startoftext|>a",
        "<mask>", "a <mask> b", "a<mask>b", "a   <mask>   b", "[SEP]", "a [SEP]  b", "x[SEP]\ny",
        "ab cd", "xab cd", "ab cdx", "(ab cd)", "ab cd ab cd", "file", "ﬁle", "FILE",
        "x-y", "a--b", "-start", "end-", "a-b-c-d", "well-known state-of-the-art",
        "def f(x):\n    return x * 2\n", "int main(void) { return 0; }", "if (a && b || !c) {}",
        "<html><body>Hi</body></html>", "https://example.com/path?q=1&r=2#frag", "user@example.com",
        "C:\\Windows\\System32", "$HOME/.config", "SELECT * FROM t WHERE x > 0;", "a+b=c", "...", "!!!???",
        "***", "---", "___", "~~~", "@@@", "###", "   ...   ", ",,,", ";;", "()", "[]{}<>",
        "supercalifragilisticexpialidocious", "Pneumonoultramicroscopicsilicovolcanoconiosis",
        "a" * 300, "ab" * 200, "😀" * 100, "中" * 200, "x " * 150, " " * 300, "\n" * 100,
        "hello" * 60, "Z" * 257,
    ]
    lines = MULTILINGUAL.splitlines()
    s += lines
    s.append(MULTILINGUAL)
    # whole paragraphs of local prose
    for path in sorted(glob.glob("/usr/share/common-licenses/*"))[:6]:
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                s.append(f.read()[:1500])
    rnd = random.Random(3)
    frags = (["the", "The", "THE", "cat", "über", "naïve", "façade", "你好", "世界", "テスト", "한국", "مرحبا",
              "שלום", "Привет", "😀", "👍🏽", "🇯🇵", "👨‍👩‍👧", "e\u0301", "1", "22", "333", "4444", "55555",
              "3.14", "'s", "'S", "'ll", "'LL", "'d", "'ve", "'RE", "n't", ",", ".", "!", "?", "...", "-", "--",
              "(", ")", "\"", "'", "`", "/", "\\", "<", ">", "_", "#", "$", "%", "&", "*", "+", "=", "@", "^", "|",
              "~", "\u00a0", "\u3000", "\t", "\r\n", "\n", "  ", "ﬁ", "ＡＢ", "①", "٣", "\u200b", "\ufeff",
              "<mask>", "[SEP]", "ab cd", "file"] + SPECIALS[:12] + ["<img_size_512>", "<img_ratio_7>"])
    seps = ["", " ", " ", " ", "  ", "\n", "\t", ""]
    while len(s) < 560:
        k = rnd.randint(1, 8)
        parts = [rnd.choice(frags) for _ in range(k)]
        out = parts[0]
        for p in parts[1:]:
            out += rnd.choice(seps) + p
        s.append(out)
    seen, uniq = set(), []
    for x in s:
        if x not in seen:
            seen.add(x)
            uniq.append(x)
    return uniq


# --------------------------------------------------------------- tokenizers

def corpus_files(tmp):
    """Local text: licenses, Debian python policy, git release notes."""
    files = [p for p in sorted(glob.glob("/usr/share/common-licenses/*")) if os.path.isfile(p)]
    policy = "/usr/share/doc/python3/python-policy.txt.gz"
    if os.path.exists(policy):
        out = os.path.join(tmp, "python-policy.txt")
        with gzip.open(policy, "rt", encoding="utf-8", errors="replace") as f, open(out, "w") as g:
            g.write(f.read())
        files.append(out)
    files += sorted(glob.glob("/usr/share/doc/git/RelNotes/2.4*.txt"))
    ml = os.path.join(tmp, "multilingual.txt")
    with open(ml, "w", encoding="utf-8") as f:
        f.write(MULTILINGUAL * 20)
    files.append(ml)
    return files


def byte_level_bpe(files, vocab_size, specials, pre):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pt.ByteLevel.alphabet(), min_frequency=2)
    tok.train(files, trainer)
    return tok


def gpt4_pre():
    return pt.Sequence([pt.Split(Regex(GPT4_SPLIT), "isolated", invert=False),
                        pt.ByteLevel(add_prefix_space=False, use_regex=False)])


def with_model(js_model, normalizer=None, pre_tokenizer=None, decoder="ByteLevel"):
    """A tokenizer.json dict around a copy of a BPE model dict."""
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": None,
        "decoder": ({"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
                    if decoder == "ByteLevel" else None),
        "model": json.loads(json.dumps(js_model)),
    }


def split(pattern, behavior, invert=False, regex=True):
    return {"type": "Split", "pattern": {"Regex" if regex else "String": pattern}, "behavior": behavior,
            "invert": invert}


BL_PLAIN = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


def added(tid, content, special=False, lstrip=False, rstrip=False, single_word=False, normalized=None):
    return {"id": tid, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def extras(mini_model, files, out_dir):
    """Small tokenizers exercising the other components; all share the mini model."""
    n = len(mini_model["vocab"])
    out = {}

    t = with_model(mini_model, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                              "use_regex": True})
    t["model"]["merges"] = [" ".join(m) for m in t["model"]["merges"]]   # legacy "a b" merges
    t["added_tokens"] = [added(n, "<|endoftext|>", special=True), added(n + 1, "<mask>", lstrip=True),
                         added(n + 2, "[SEP]", rstrip=True), added(n + 3, "ab cd", single_word=True,
                                                                   normalized=False)]
    out["gpt2-prefix"] = t

    t = with_model(mini_model, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        split(r"\s+", "Isolated"), {"type": "Digits", "individual_digits": True}, BL_PLAIN]})
    out["split-isolated-digits"] = t

    t = with_model(mini_model, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        split(r"[\s,.]+", "Removed"), BL_PLAIN]})
    t["added_tokens"] = [added(n, "<|endoftext|>", special=True)]
    out["split-removed"] = t

    t = with_model(mini_model, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        split("-", "MergedWithPrevious", regex=False), split(" ", "MergedWithPrevious", regex=False), BL_PLAIN]})
    out["split-prev"] = t

    t = with_model(mini_model, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        split(r"\p{P}+", "MergedWithNext"), split(r"\s", "MergedWithNext", invert=True), BL_PLAIN]})
    out["split-next-invert"] = t

    t = with_model(mini_model, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        split(r"\p{N}|\p{P}", "Contiguous"), {"type": "Digits", "individual_digits": False},
        split(r"\p{L}+", "Removed", invert=True), BL_PLAIN]})
    out["split-contiguous"] = t

    t = with_model(mini_model, normalizer={"type": "Sequence", "normalizers": [{"type": "NFKC"},
                                                                                {"type": "Lowercase"}]},
                   pre_tokenizer={"type": "Sequence", "pretokenizers": [split(GPT4_SPLIT, "Isolated"), BL_PLAIN]})
    t["added_tokens"] = [added(n, "<|endoftext|>", special=True), added(n + 1, "ﬁle"),
                         added(n + 2, "<MASK>", normalized=True)]
    out["nfkc-lower"] = t

    t = with_model(mini_model, normalizer={"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": False, "strip_right": True},
        {"type": "NFC"}, {"type": "Replace", "pattern": {"String": "  "}, "content": " "},
        {"type": "Replace", "pattern": {"Regex": r"\d+"}, "content": "#"}, {"type": "Prepend", "prepend": ">"}]},
        pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True})
    out["nfc-replace-prepend"] = t

    t = with_model(mini_model, normalizer={"type": "NFD"}, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        split(r"b*", "Isolated"), split(r"^\s*\w+|\d+$|[^\S\n]+|\h+|\bx", "Isolated"),
        split(r"(?i)[^\s\w]{2,}", "MergedWithNext"), BL_PLAIN]})
    out["regex-onig"] = t

    # a char-level (not byte-level) BPE with unk, prefixes and no decoder,
    # trained on ASCII letters only: everything else is unknown. The trainer
    # orders the prefixed alphabet differently from run to run, so a committed
    # copy is kept.
    kept = os.path.join(out_dir, "unk-prefix-nodecoder.json")
    if os.path.exists(kept):
        with open(kept, encoding="utf-8") as f:
            out["unk-prefix-nodecoder"] = json.load(f)
    else:
        tok = Tokenizer(models.BPE(unk_token="[UNK]", fuse_unk=True, continuing_subword_prefix="##",
                                   end_of_word_suffix="</w>"))
        tok.pre_tokenizer = pt.Split(Regex(r"\w+|[^\w\s]+"), "isolated")
        trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["[UNK]", "<|endoftext|>"],
                                      show_progress=False, continuing_subword_prefix="##", end_of_word_suffix="</w>")
        letters = []
        for path in files:
            with open(path, encoding="utf-8", errors="replace") as f:
                letters.append(re.sub(r"[^A-Za-z.,;'\s]", "", f.read()))
        tok.train_from_iterator(letters, trainer)
        out["unk-prefix-nodecoder"] = json.loads(tok.to_str())

    # the pre-tokenizers of two released families, on the mini model
    t = with_model(mini_model, normalizer={"type": "NFC"}, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        split(QWEN2_SPLIT, "Isolated"), BL_PLAIN]})
    t["added_tokens"] = [added(n, "<|endoftext|>", special=True), added(n + 1, "<|im_start|>", special=True)]
    out["qwen2-style"] = t
    t = with_model(mini_model, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        split(p, "Isolated") for p in DEEPSEEK_SPLITS] + [BL_PLAIN]})
    out["deepseek-style"] = t

    t = with_model(mini_model, pre_tokenizer={"type": "Sequence", "pretokenizers": [split(GPT4_SPLIT, "Isolated"),
                                                                                     BL_PLAIN]})
    t["model"]["ignore_merges"] = True
    for w in ["hello", "Ġworld", "the", "Ġthe", "ing", "123", "ä¸Ń"]:   # whole words the merges may not reach
        if w not in t["model"]["vocab"]:
            t["model"]["vocab"][w] = len(t["model"]["vocab"])
    t["added_tokens"] = [added(len(t["model"]["vocab"]), "<|endoftext|>", special=True)]
    out["ignore-merges"] = t
    return out


def class_strings():
    """Code points for the character-class tokenizers: all of the first 1024,
    then every 31st up to U+20000, in strings of 256. Only code points
    assigned in Unicode 14.0 (PCRE2 10.42's tables; the library's Oniguruma
    knows later versions)."""
    import unicodedata
    cps = [c for c in list(range(1, 1024)) + list(range(1024, 0x20000, 31))
           if not 0xd800 <= c <= 0xdfff and unicodedata.category(chr(c)) != "Cn"]
    return ["".join(chr(c) for c in cps[i:i + 256]) for i in range(0, len(cps), 256)]


CLASSES = {"w": r"\w", "s": r"\s", "d": r"\d", "h": r"\h", "neg-s": r"[^\S\n]", "word-dash": r"[\w\-]",
           "not-w": r"\W", "class-not-w": r"[\W]", "class-neg-w": r"[^\w]",
           "L": r"\p{L}", "N": r"\p{N}", "P": r"\p{P}", "S": r"\p{S}", "dot": r"(?m:.)|.",
           "caseless": r"(?i:[a-z]|k|s|\u00e5)"}


def class_tokenizers():
    """Byte tokens and no merges, keeping only what a class matches: the ids
    show exactly which code points it contains."""
    vocab = {c: i for i, c in enumerate(sorted(pt.ByteLevel.alphabet()))}
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": vocab, "merges": []}
    return {"class-" + k: with_model(model, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        split(v, "Removed", invert=True), BL_PLAIN]}) for k, v in CLASSES.items()}


# ------------------------------------------------------------------ writing

def load_json_tok(d):
    return Tokenizer.from_str(json.dumps(d))


def expected_rows(tok, strings):
    rows = []
    for s in strings:
        tok.encode_special_tokens = False
        ids = tok.encode(s, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        plain = tok.encode(s, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        dec = tok.decode(ids, skip_special_tokens=False)
        dec_skip = tok.decode(ids, skip_special_tokens=True)
        rows.append([ids, None if plain == ids else plain, None if dec == s else dec,
                     None if dec_skip == dec else dec_skip])
    return rows


def decode_rows(tok, rnd, count=150):
    vocab = tok.get_vocab_size(with_added_tokens=True)
    rows = []
    for i in range(count):
        ids = [rnd.randrange(vocab) for _ in range(rnd.randint(0, 12))]
        rows.append([ids, tok.decode(ids, skip_special_tokens=False), tok.decode(ids, skip_special_tokens=True)])
    return rows


def write_jsonl(path, rows):
    """Compact JSON lines; \\u escapes in upper case, as jansson writes them
    (so that `hi3 tokenize --decode` output compares byte for byte)."""
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            line = json.dumps(r, ensure_ascii=False, separators=(",", ":"))
            f.write(re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m.group(1).upper(), line) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="the fixtures directory (tok/ is written inside)")
    args = ap.parse_args()
    out = os.path.join(args.out, "tok")
    os.makedirs(out, exist_ok=True)
    hi3 = os.environ.get("HI3", "hi3")
    strings = make_strings()
    write_jsonl(os.path.join(out, "strings.jsonl"), strings)
    cstrings = class_strings()
    write_jsonl(os.path.join(out, "classes.jsonl"), cstrings)
    rnd = random.Random(7)

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([hi3, "-q", "init-model", "--preset", "tiny", "-o", os.path.join(tmp, "init")], check=True)
        toks = {"init": Tokenizer.from_file(os.path.join(tmp, "init", "tokenizer.json"))}
        files = corpus_files(tmp)

        bpe = byte_level_bpe(files, 4400, SPECIALS, gpt4_pre())
        js = json.loads(bpe.to_str())
        toks["bpe"] = bpe
        mini = byte_level_bpe(files, 600, [], gpt4_pre())
        mini_model = json.loads(mini.to_str())["model"]
        for name, d in extras(mini_model, files, out).items():
            toks[name] = load_json_tok(d)
            js_all = d
            with open(os.path.join(out, name + ".json"), "w", encoding="utf-8") as f:
                json.dump(js_all, f, ensure_ascii=False)
        with open(os.path.join(out, "bpe.json"), "w", encoding="utf-8") as f:
            json.dump(js, f, ensure_ascii=False)

        classes = class_tokenizers()
        for name, d in classes.items():
            toks[name] = load_json_tok(d)
            with open(os.path.join(out, name + ".json"), "w", encoding="utf-8") as f:
                json.dump(d, f, ensure_ascii=False)

        for name, tok in toks.items():
            rows = expected_rows(tok, cstrings if name in classes else strings)
            write_jsonl(os.path.join(out, name + ".expected.jsonl"), rows)
            if name not in classes:
                write_jsonl(os.path.join(out, name + ".decode.jsonl"), decode_rows(tok, rnd))
            if name == "init":
                write_jsonl(os.path.join(out, "init.ids.jsonl"), [r[0] for r in rows])
            print("%-24s %d strings, vocab %d" % (name, len(rows), tok.get_vocab_size()), file=sys.stderr)
    with open(os.path.join(out, "tokenizers.txt"), "w") as f:
        f.write("# name [strings file]: the tokenizers test-tok checks\n")
        for n in ["init", "bpe"] + sorted(n for n in toks if n not in ("init", "bpe")):
            f.write(n + (" classes.jsonl" if n in classes else "") + "\n")


if __name__ == "__main__":
    main()
