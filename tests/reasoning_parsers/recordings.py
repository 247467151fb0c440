"""Model outputs written from each family's documented reasoning format.

``RECORDINGS[parser]``: (label, in_reasoning, text, expected reasoning, expected
content). ``in_reasoning`` is what the frontend passes (``None``: unknown).
"""

CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather "
    '<|constrain|>json<|message|>{"city": "Paris"}<|call|>'
)

RECORDINGS = {
    "deepseek_r1": [
        # The R1 template ends the prompt with "<think>\n": no start tag in the output.
        (
            "prompt_opened",
            True,
            "The user asks for 2 + 2.\nThat is 4.\n</think>\n\nThe answer is **4**.",
            "The user asks for 2 + 2.\nThat is 4.\n",
            "\n\nThe answer is **4**.",
        ),
        (
            "prompt_opened_unknown",
            None,
            "The user asks for 2 + 2.\nThat is 4.\n</think>\n\nThe answer is **4**.",
            "The user asks for 2 + 2.\nThat is 4.\n",
            "\n\nThe answer is **4**.",
        ),
        # R1-0528 writes the start tag itself.
        ("start_tag_in_output", None, "<think>\nHmm, 4.\n</think>\n\n4", "\nHmm, 4.\n", "\n\n4"),
        (
            "truncated",
            None,
            "Let me think about this carefully. First,",
            "Let me think about this carefully. First,",
            None,
        ),
        (
            "truncated_in_end_tag",
            True,
            "So the answer is 4.\n</thi",
            "So the answer is 4.\n</thi",
            None,
        ),
        (
            "unicode",
            True,
            "日本語で考える 🤔 — naïve café\n</think>\n\n答えは42です。",
            "日本語で考える 🤔 — naïve café\n",
            "\n\n答えは42です。",
        ),
        (
            "tags_after_the_end_are_content",
            True,
            "a</think>b</think><think>c",
            "a",
            "b</think><think>c",
        ),
        (
            "lookalike_tags",
            True,
            "<thinking> </ think> </think\n</think>ok",
            "<thinking> </ think> </think\n",
            "ok",
        ),
        ("empty_reasoning", True, "</think>\n\nHi there.", None, "\n\nHi there."),
        ("not_in_reasoning", False, "Plain answer.", None, "Plain answer."),
        ("not_in_reasoning_but_opens", False, "<think>x</think>y", "x", "y"),
        ("empty", None, "", None, None),
    ],
    "qwen3": [
        # enable_thinking=True (default): the model writes <think> itself.
        (
            "thinking_on",
            False,
            "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?",
            "\nThe user greets me.\n",
            "\n\nHello! How can I help?",
        ),
        (
            "thinking_on_unknown",
            None,
            "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?",
            "\nThe user greets me.\n",
            "\n\nHello! How can I help?",
        ),
        # enable_thinking=False: the prompt ends with an empty think block.
        ("thinking_off", False, "Hello! How can I help?", None, "Hello! How can I help?"),
        ("thinking_off_unknown", None, "Hello! How can I help?", None, "Hello! How can I help?"),
        # Qwen3-Thinking-2507: the prompt ends with "<think>\n".
        (
            "thinking_2507",
            True,
            "Okay, the user wants a haiku.\n</think>\n\nAutumn moonlight",
            "Okay, the user wants a haiku.\n",
            "\n\nAutumn moonlight",
        ),
        (
            "thinking_2507_unknown",
            None,
            "Okay, the user wants a haiku.\n</think>\n\nAutumn moonlight",
            "Okay, the user wants a haiku.\n",
            "\n\nAutumn moonlight",
        ),
        (
            "truncated_thinking",
            False,
            "<think>\nStill thinking about",
            "\nStill thinking about",
            None,
        ),
        ("truncated_2507_in_tag", True, "Still thinking </th", "Still thinking </th", None),
        ("truncated_2507_unknown", None, "Still thinking", None, "Still thinking"),
        (
            "tool_call_after_thinking",
            False,
            "<think>\nNeed the weather.\n</think>\n\n<tool_call>\n"
            '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
            "\nNeed the weather.\n",
            '\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
        ),
        (
            "unicode",
            False,
            "<think>\nÜbersetzung: 你好 → hello 👋\n</think>\n\nHallo 👋",
            "\nÜbersetzung: 你好 → hello 👋\n",
            "\n\nHallo 👋",
        ),
        ("stray_end_tag_not_in_reasoning", False, "a</think>b", None, "a</think>b"),
        ("late_start_tag_unknown", None, "Sure <think>x</think>y", None, "Sure <think>x</think>y"),
        ("partial_start_tag_only", None, "<thi", None, "<thi"),
        ("empty", False, "", None, None),
    ],
    "gpt_oss": [
        (
            "analysis_final",
            None,
            "<|channel|>analysis<|message|>User says hi. Respond politely.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>Hello! How can I help you today?"
            "<|return|>",
            "User says hi. Respond politely.",
            "Hello! How can I help you today?",
        ),
        # <|return|> is a stop token: the detokenized output may end without it.
        (
            "stop_token_stripped",
            False,
            "<|channel|>analysis<|message|>Short.<|end|><|start|>assistant<|channel|>final"
            "<|message|>Hi!",
            "Short.",
            "Hi!",
        ),
        (
            "tool_call",
            None,
            "<|channel|>analysis<|message|>Need the weather for Paris.<|end|>" + CALL,
            "Need the weather for Paris.",
            CALL,
        ),
        (
            "preamble_and_call",
            None,
            "<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant"
            "<|channel|>commentary<|message|>Checking now.<|end|>" + CALL,
            "Use the tool.",
            "Checking now." + CALL,
        ),
        (
            "builtin_tool",
            None,
            "<|channel|>analysis<|message|>Search.<|end|><|start|>assistant<|channel|>analysis"
            ' to=browser.search code<|message|>{"query": "x"}<|call|>',
            'Search.{"query": "x"}',
            None,
        ),
        (
            "truncated_analysis",
            None,
            "<|channel|>analysis<|message|>The user wants",
            "The user wants",
            None,
        ),
        (
            "truncated_header",
            None,
            "<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>fin",
            "Done.",
            None,
        ),
        (
            "prompt_opened_analysis",
            True,
            "Thinking here.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>",
            "Thinking here.",
            "Done.",
        ),
        (
            "final_only",
            None,
            "<|channel|>final<|message|>Just the answer.<|return|>",
            None,
            "Just the answer.",
        ),
        (
            "unicode",
            None,
            "<|channel|>analysis<|message|>Réponse en français 🇫🇷 — 日本<|end|><|start|>assistant"
            "<|channel|>final<|message|>Bonjour 👋 ¿qué tal?<|return|>",
            "Réponse en français 🇫🇷 — 日本",
            "Bonjour 👋 ¿qué tal?",
        ),
        (
            "lookalike_text",
            None,
            "<|channel|>analysis<|message|>a <|chan b < | c<|end|><|start|>assistant"
            "<|channel|>final<|message|><| x |><|return|>",
            "a <|chan b < | c",
            "<| x |>",
        ),
        ("bare_text", None, "No harmony here.", None, "No harmony here."),
        ("empty", None, "", None, None),
    ],
}
