"""Instruction following with a constraint a regular expression checks (scorer ``regex``)."""

from __future__ import annotations

import random
import re

from kvserve.evaluate.builtin.vocab import TOPICS, pick

TYPE, SCORER = "instruction", "regex"
_SENTENCES = {
    "en": ["The library opens at nine.", "Fresh bread is sold every morning.",
           "The train to the coast leaves at noon.", "Our garden has three old apple trees."],
    "zh": ["图书馆九点开门。", "每天早上都有新鲜的面包。", "去海边的火车中午出发。",
           "我们的花园里有三棵老苹果树。"],
}  # fmt: skip


def _en(rng: random.Random, topic: str) -> tuple[str, str]:
    sentence = rng.choice(_SENTENCES["en"])
    return rng.choice([
        (f"Write one sentence about {topic}. Use only lowercase letters.",
         r"\A(?=[\s\S]*[a-z])[^A-Z]+\Z"),
        (f"Write a short sentence about {topic} and end your reply with the word DONE.",
         r"DONE\W*\Z"),
        (f"Start your reply with the word Yes, then say one thing about {topic}.",
         r"\A\W*Yes\b"),
        (f"Repeat this sentence exactly and add nothing else: {sentence}",
         r"\A\W*" + re.escape(sentence.rstrip(".")) + r"\W*\Z"),
    ])  # fmt: skip


def _zh(rng: random.Random, topic: str) -> tuple[str, str]:
    sentence = rng.choice(_SENTENCES["zh"])
    return rng.choice([
        (f"请以“好的”开头，然后用一句话介绍{topic}。", r"\A\W*好的"),
        (f"用一句话介绍{topic}，并以“完毕”两个字结尾。", r"完毕\W*\Z"),
        (f"用不超过二十个字介绍{topic}。", r"\A[\s\S]{1,20}\Z"),
        (f"请原样重复下面这句话，不要添加任何内容：{sentence}",
         r"\A\W*" + re.escape(sentence.rstrip("。")) + r"\W*\Z"),
    ])  # fmt: skip


def make(rng: random.Random, lang: str) -> tuple[str, str]:
    topic = pick(rng, TOPICS, lang)[0]
    return _zh(rng, topic) if lang == "zh" else _en(rng, topic)
