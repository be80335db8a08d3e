"""Word lists the built-in generators draw from, English and Chinese side by side."""

from __future__ import annotations

import random

NAMES = {
    "en": ["Alice", "Ben", "Clara", "David", "Emma", "Frank", "Grace", "Henry", "Irene", "Jack",
           "Karen", "Leo", "Maria", "Nora", "Oscar", "Paul", "Rosa", "Sam", "Tina", "Victor"],
    "zh": ["小明", "小红", "王芳", "李雷", "韩梅", "张伟", "刘洋", "陈静", "赵磊", "孙丽",
           "周杰", "吴敏", "郑强", "冯雪", "何平", "高峰", "林涛", "罗兰", "宋佳", "唐宁"],
}  # fmt: skip
CITIES = {
    "en": ["Paris", "London", "Berlin", "Madrid", "Rome", "Vienna", "Oslo", "Dublin", "Lisbon",
           "Prague", "Athens", "Warsaw"],
    "zh": ["北京", "上海", "广州", "深圳", "成都", "杭州", "西安", "南京", "武汉", "重庆",
           "天津", "苏州"],
}  # fmt: skip
JOBS = {
    "en": ["teacher", "doctor", "baker", "pilot", "farmer", "nurse", "painter", "driver"],
    "zh": ["老师", "医生", "面包师", "飞行员", "农民", "护士", "画家", "司机"],
}
PETS = {
    "en": ["cats", "dogs", "rabbits", "birds", "fish", "turtles"],
    "zh": ["猫", "狗", "兔子", "鸟", "鱼", "乌龟"],
}
DRINKS = {
    "en": ["tea", "coffee", "milk", "orange juice", "water", "cocoa"],
    "zh": ["茶", "咖啡", "牛奶", "橙汁", "温水", "豆浆"],
}
ITEMS = {
    "en": ["apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "stamps"],
    "zh": ["苹果", "铅笔", "贴纸", "弹珠", "饼干", "橘子", "鸡蛋", "气球"],
}
PRODUCTS = {
    "en": ["desk lamps", "notebooks", "water bottles", "backpacks", "umbrellas", "headphones"],
    "zh": ["台灯", "笔记本", "水杯", "背包", "雨伞", "耳机"],
}
TOPICS = {
    "en": ["the ocean", "autumn", "trains", "coffee", "mountains", "libraries", "rain", "music"],
    "zh": ["大海", "秋天", "火车", "茶", "高山", "图书馆", "下雨", "音乐"],
}


def pick(rng: random.Random, table: dict[str, list[str]], lang: str, k: int = 1) -> list[str]:
    """``k`` distinct entries of ``table[lang]``."""
    return rng.sample(table[lang], k)


def date(rng: random.Random) -> str:
    return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
