#!/usr/bin/env python3
"""Builds the training text of models/wren-tiny from Debian packages (plain Python, no dependencies).

Sources (install first: apt-get install fortunes fortunes-min bible-kjv bible-kjv-text wordnet-base):
  fortunes, fortunes-min  /usr/share/games/fortunes/*      BSD licence (fortune-mod); quotations
  bible-kjv-text          `bible Gen1:1-Rev22:21`       KJV text, public domain (reader: GPL-2+)
  wordnet-base            /usr/share/wordnet/data.*        WordNet 3.0 licence (permissive, BSD-like)

Writes OUT_DIR/docs.jsonl: one JSON object per line, {"src": ..., "text": ...} for raw text, or
{"src": "chat", "user": ..., "answer": ...} for chat turns made from the same text.
Held out (never trained on, used by the perplexity test): every 50th document of each source; they go
to OUT_DIR/heldout.jsonl.
"""
import json, os, random, re, subprocess, sys

out_dir = sys.argv[1] if len(sys.argv) > 1 else "build/train-corpus"
os.makedirs(out_dir, exist_ok=True)
rng = random.Random(2026)
docs = []  # (src, text)

# --- fortunes: files without an extension, entries separated by lines of '%'
fdir = "/usr/share/games/fortunes"
skip = {"ascii-art", "art", "translate-me"}  # pictures made of characters and non-English text
for name in sorted(os.listdir(fdir)):
    p = os.path.join(fdir, name)
    if "." in name or name in skip or not os.path.isfile(p):
        continue
    with open(p, encoding="utf-8", errors="replace") as f:
        text = f.read()
    for entry in re.split(r"\n%\n", text):
        entry = entry.strip("\n")
        if 20 <= len(entry) <= 1500:
            docs.append(("fortunes", entry))

# --- KJV: one document per chapter, verse numbers dropped, wrapped lines joined
kjv = subprocess.run(["bible", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True).stdout
chapter, verses, cur = None, [], None
def flush():
    if chapter and verses:
        docs.append(("kjv", chapter + "\n" + " ".join(verses)))
for line in kjv.split("\n"):
    m = re.match(r"^\s+(\d+) (.*)$", line)
    if m:
        verses.append(m.group(2).strip())
    elif re.match(r"^[1-3A-Z][A-Za-z ]* \d+$", line.strip()) and not line.startswith(" "):
        flush()
        chapter, verses = line.strip(), []
    elif line.strip() and verses:
        verses[-1] += " " + line.strip()
flush()

# --- WordNet glosses as sentences, plus chat turns asking for them
def article(w):
    return "an" if w[0].lower() in "aeiou" else "a"
for pos, fname in (("n", "data.noun"), ("v", "data.verb"), ("a", "data.adj"), ("r", "data.adv")):
    with open(f"/usr/share/wordnet/{fname}", encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("  ") or "|" not in line:
                continue
            head, gloss = line.split("|", 1)
            parts = head.split()
            n = int(parts[3], 16)
            words = [parts[4 + 2 * i].replace("_", " ") for i in range(n)]
            words = [re.sub(r"\(.*\)$", "", w) for w in words]
            gloss = gloss.strip()
            defs = [g.strip() for g in gloss.split(";")]
            definition = [d for d in defs if not d.startswith('"')]
            examples = [d.strip('"') for d in defs if d.startswith('"')]
            if not definition:
                continue
            d = definition[0]
            w = words[0]
            if pos == "n":
                proper = w[0].isupper()
                subj = w if proper else f"{article(w).capitalize()} {w}"
                cap = re.match(r"^(?:the )?(?:capital|capital city|chief city)(?: and largest city)?(?: and chief port)? of (.+)$", d)
                if proper and cap:  # "Paris: the capital and largest city of France" -> a second sentence
                    docs.append(("wordnet", f"The capital of {cap.group(1)} is {w}."))
                sent = f"{subj} is {d}."
            elif pos == "v":
                sent = f"To {w} is to {d}."
            else:
                sent = f"{w.capitalize()} means {d}."
            if len(words) > 1:
                sent += " Other words for it: " + ", ".join(words[1:]) + "."
            for e in examples[:2]:
                sent += " For example: \"" + e + "\"."
            docs.append(("wordnet", sent))

# --- chat turns made from the same text
chat = []
qs_def = ["What is {w}?", "What does {w} mean?", "Define {w}.", "Tell me what {w} means.", "what is {w}"]
qs_quote = ["Tell me a fortune.", "Give me a quote.", "Say something wise.", "Tell me something funny.",
            "Share a saying.", "Can you tell me a joke?"]
qs_verse = ["Read me a verse from {b}.", "Quote {b}.", "What does {b} say?"]
greets = [("Hi", "Hello! How can I help you today?"), ("Hello", "Hello! What would you like to talk about?"),
          ("Hi!", "Hi! Ask me about a word, or ask me for a fortune or a verse."),
          ("Hey", "Hello there. What can I do for you?"), ("Good morning", "Good morning! How can I help?"),
          ("How are you?", "I am well, thank you. How can I help you?"),
          ("Who are you?", "I am Wren, a small language model. I know some words, fortunes and verses."),
          ("What can you do?", "I can explain words, tell you a fortune, or quote a verse from the Bible."),
          ("Thanks", "You are welcome!"), ("Thank you!", "You are welcome. Anything else?"),
          ("Bye", "Goodbye!")]
for src, t in docs:
    if src == "wordnet":
        m = re.match(r"^(?:An? |To )?(.+?) (?:is|means) (.*)$", t)
        capm = re.match(r"^The capital of (.+) is (.+)\.$", t)
        if capm:
            chat.append((rng.choice(["What is the capital of {x}?", "What's the capital of {x}?",
                                     "Name the capital of {x}."]).format(x=capm.group(1)), t))
        elif m and rng.random() < 0.25:
            chat.append((rng.choice(qs_def).format(w=m.group(1)), t.split(" Other words")[0].split(" For example")[0]))
    elif src == "fortunes" and len(t) < 400 and rng.random() < 0.2:
        chat.append((rng.choice(qs_quote), t))
    elif src == "kjv" and rng.random() < 0.3:
        book, rest = t.split("\n", 1)
        sents = re.split(r"(?<=[.:;]) ", rest)
        chat.append((rng.choice(qs_verse).format(b=book), " ".join(sents[:3])))
for _ in range(300):
    chat.extend(greets)

train, held = [], []
count = {}
for src, t in docs:
    count[src] = count.get(src, 0) + 1
    (held if count[src] % 50 == 0 else train).append({"src": src, "text": t})
for u, a in chat:
    train.append({"src": "chat", "user": u, "answer": a})
rng.shuffle(train)
with open(os.path.join(out_dir, "docs.jsonl"), "w") as f:
    for d in train:
        f.write(json.dumps(d) + "\n")
with open(os.path.join(out_dir, "heldout.jsonl"), "w") as f:
    for d in held:
        f.write(json.dumps(d) + "\n")
print({k: v for k, v in count.items()}, "chat", len(chat), "train", len(train), "held", len(held), file=sys.stderr)
