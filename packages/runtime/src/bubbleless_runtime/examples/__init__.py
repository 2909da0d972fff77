"""Data the runtime ships for its demos (package data; licence in ``DATA_LICENSE.md``):
``instructions.jsonl``, short instruction chats that ``make_instructions.py`` generates, which
``bubbleless train --example smollm2-lora`` fine-tunes on."""
