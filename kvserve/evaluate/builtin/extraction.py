"""Extract fields from a sentence into JSON (scorer ``json_fields``)."""

from __future__ import annotations

import random

from kvserve.evaluate.builtin.vocab import NAMES, PRODUCTS, date, pick

TYPE, SCORER = "extraction", "json_fields"


def make(rng: random.Random, lang: str) -> tuple[str, dict]:
    name, product = pick(rng, NAMES, lang)[0], pick(rng, PRODUCTS, lang)[0]
    qty, order, day = rng.randint(2, 12), rng.randint(1000, 9999), date(rng)
    keys = '"name", "product", "quantity", "order_id"'
    if lang == "zh":
        fact = f"{name}于{day}订购了{qty}个{product}，订单号是{order}。"
        text = (f"从下面的文字中提取客户姓名、商品、数量和订单号，输出一个 JSON 对象，"
                f"键为 {keys}。只输出 JSON。\n\n文字：{fact}")  # fmt: skip
    else:
        fact = f"On {day}, {name} ordered {qty} {product}. The order number is {order}."
        text = (f"Extract the customer name, the product, the quantity and the order number "
                f"from the text below as a JSON object with the keys {keys}. Output only the "
                f"JSON.\n\nText: {fact}")  # fmt: skip
    return text, {"name": name, "product": product, "quantity": qty, "order_id": order}
