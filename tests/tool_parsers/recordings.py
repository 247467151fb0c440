"""Model outputs written from each family's documented tool-call format.

``WELL_FORMED[parser]``: (label, tools, text, expected content, expected calls as
(name, arguments object)). ``MALFORMED[parser]``: (label, tools, text, expected
content, expected names of the calls that still parse).
"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "metric": {"type": "boolean"}, "ratio": {"type": "number"},
        "options": {"type": "object"}, "hours": {"type": ["array", "null"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]

NESTED = {"query": 'café "best" ☕ \\ back', "filters": {"tags": ["a\\b", "日本", "\n"],
                                                        "limit": 5, "strict": True,
                                                        "extra": None}}

WELL_FORMED = {
    "hermes": [
        ("one", None,
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
         "</tool_call>",
         None, [("get_weather", {"city": "Paris", "days": 3})]),
        ("several", TOOLS,
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>',
         None, [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})]),
        ("content_around", None,
         "I'll look that up.\n\n<tool_call>\n"
         '{"name": "get_time", "arguments": {}}\n</tool_call>\nAnything else?',
         "I'll look that up.Anything else?", [("get_time", {})]),
        ("qwen3_thinking", None,
         "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n"
         '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
         "<think>\nThe user wants the weather.\n</think>", [("get_weather", {"city": "Oslo"})]),
        ("nested_unicode", None,
         '<tool_call>\n{"name": "search", "arguments": {"query": "caf\\u00e9 \\"best\\" \u2615 '
         '\\\\ back", "filters": {"tags": ["a\\\\b", "日本", "\\n"], "limit": 5, '
         '"strict": true, "extra": null}}}\n</tool_call>',
         None, [("search", NESTED)]),
        ("arguments_with_tag_text", None,
         '<tool_call>{"name": "echo", "arguments": {"s": "</tool_call> <tool_call>"}}'
         "</tool_call>",
         None, [("echo", {"s": "</tool_call> <tool_call>"})]),
        ("name_after_arguments", None,
         '<tool_call>{"arguments": {"x": [1, 2]}, "name": "f"}</tool_call>',
         None, [("f", {"x": [1, 2]})]),
        ("plain_text", None, "The weather in Paris is sunny, 21 °C.",
         "The weather in Paris is sunny, 21 °C.", []),
    ],
    "llama3_json": [
        ("one", None, '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
         None, [("get_weather", {"city": "Paris", "days": 3})]),
        ("python_tag_several", TOOLS,
         '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
         '{"name": "get_time", "parameters": {"tz": "UTC"}}',
         None, [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "UTC"})]),
        ("content_after", None,
         '{"name": "get_time", "parameters": {}}\nI called the clock.',
         "I called the clock.", [("get_time", {})]),
        ("content_before_is_content", None,
         'Here it is: {"name": "get_time", "parameters": {}}',
         'Here it is: {"name": "get_time", "parameters": {}}', []),
        ("nested_unicode", None,
         '{"name": "search", "parameters": {"query": "caf\\u00e9 \\"best\\" \u2615 \\\\ back", '
         '"filters": {"tags": ["a\\\\b", "日本", "\\n"], "limit": 5, "strict": true, '
         '"extra": null}}}',
         None, [("search", NESTED)]),
        ("plain_text", None, "Paris is the capital of France.",
         "Paris is the capital of France.", []),
    ],
    "mistral": [
        ("one_list", None,
         '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]',
         None, [("get_weather", {"city": "Paris", "days": 3})]),
        ("several_list", TOOLS,
         '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
         '{"name": "get_time", "arguments": {"tz": "UTC"}}]',
         None, [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "UTC"})]),
        ("several_named", TOOLS,
         '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}',
         None, [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "UTC"})]),
        ("content_before", None,
         'Let me check the weather.[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}',
         "Let me check the weather.", [("get_weather", {"city": "Rome"})]),
        ("content_after_list", None,
         '[TOOL_CALLS][{"name": "get_time", "arguments": {}}] Calling the clock.',
         "Calling the clock.", [("get_time", {})]),
        ("call_id", None, '[TOOL_CALLS]get_time[CALL_ID]a1B2c3D4e[ARGS]{"tz": "UTC"}',
         None, [("get_time", {"tz": "UTC"})]),
        ("nested_unicode", None,
         '[TOOL_CALLS]search[ARGS]{"query": "caf\\u00e9 \\"best\\" \u2615 \\\\ back", '
         '"filters": {"tags": ["a\\\\b", "日本", "\\n"], "limit": 5, "strict": true, '
         '"extra": null}}',
         None, [("search", NESTED)]),
        ("plain_text", None, "No tools needed [really].", "No tools needed [really].", []),
    ],
    "qwen3_coder": [
        ("one_typed", TOOLS,
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
         None, [("get_weather", {"city": "Paris", "days": 3})]),
        ("untyped_are_strings", None,
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
         None, [("get_weather", {"city": "Paris", "days": "3"})]),
        ("several", TOOLS,
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n"
         "</parameter>\n</function>\n</tool_call>",
         None, [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "UTC"})]),
        ("content_around", None,
         "Let me check.\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>\nDone?",
         "Let me check.Done?", [("get_time", {})]),
        ("all_types", TOOLS,
         "<tool_call>\n<function=get_weather>\n<parameter=metric>\nTrue\n</parameter>\n"
         "<parameter=ratio>\n0.5\n</parameter>\n<parameter=options>\n"
         '{"lang": "日本語", "q": "say \\"hi\\""}\n</parameter>\n<parameter=hours>\n[1, 2]\n'
         "</parameter>\n<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>",
         None, [("get_weather", {"metric": True, "ratio": 0.5,
                                 "options": {"lang": "日本語", "q": 'say "hi"'},
                                 "hours": [1, 2], "days": "three"})]),
        ("multiline_code_value", None,
         "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
         '<parameter=content>\ndef f():\n    return "h\\i" + \'☕\'\n\n</parameter>\n'
         "</function>\n</tool_call>",
         None, [("write_file", {"path": "src/a.py",
                                "content": "def f():\n    return \"h\\i\" + '☕'\n"})]),
        ("plain_text", None, "Use <b>bold</b> text.", "Use <b>bold</b> text.", []),
    ],
    "pythonic": [
        ("one", None, '[get_weather(city="Paris", days=3)]',
         None, [("get_weather", {"city": "Paris", "days": 3})]),
        ("several", TOOLS, "[get_weather(city='Paris'), get_time(tz=\"UTC\")]",
         None, [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "UTC"})]),
        ("llama4_wrapped", None, "<|python_start|>[get_time()]<|python_end|>",
         None, [("get_time", {})]),
        ("content_after", None, "[get_time()]\nI asked the clock.",
         "I asked the clock.", [("get_time", {})]),
        ("nested_unicode", None,
         "[search(query='caf\\u00e9 \"best\" \u2615 \\\\ back', filters={'tags': ['a\\\\b', "
         "\"日本\", '\\n'], 'limit': 5, 'strict': True, 'extra': None}, pair=(1, 2))]",
         None, [("search", {**NESTED, "pair": [1, 2]})]),
        ("dotted_and_brackets_in_strings", None,
         '[web.search(q="a, b] (c)", n=[1, [2]])]',
         None, [("web.search", {"q": "a, b] (c)", "n": [1, [2]]})]),
        ("plain_text", None, "Sure, here you go.", "Sure, here you go.", []),
    ],
    "openai": [
        ("one", None,
         "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
         "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
         '{"city": "Paris", "days": 3}<|call|>',
         None, [("get_weather", {"city": "Paris", "days": 3})]),
        ("several", TOOLS,
         "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
         '{"city": "Paris"}<|call|><|start|>assistant<|channel|>commentary '
         'to=functions.get_time <|constrain|>json<|message|>{"tz": "UTC"}<|call|>',
         None, [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "UTC"})]),
        ("preamble", None,
         "<|channel|>commentary<|message|>Checking the weather now.<|end|><|start|>assistant"
         "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
         '{"city": "Oslo"}<|call|>',
         "Checking the weather now.", [("get_weather", {"city": "Oslo"})]),
        ("stop_token_stripped", None,
         "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}",
         None, [("get_time", {})]),
        ("recipient_before_channel", None,
         '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
         '{"city": "Rome"}<|call|>',
         None, [("get_weather", {"city": "Rome"})]),
        ("reasoning_parser_content", None,
         "Let me check.<|start|>assistant<|channel|>commentary to=functions.get_weather "
         '<|constrain|>json<|message|>{"city": "Paris"}<|call|>',
         "Let me check.", [("get_weather", {"city": "Paris"})]),
        ("nested_unicode", None,
         "<|channel|>commentary to=functions.search <|constrain|>json<|message|>"
         '{"query": "caf\\u00e9 \\"best\\" \u2615 \\\\ back", "filters": {"tags": '
         '["a\\\\b", "日本", "\\n"], "limit": 5, "strict": true, "extra": null}}<|call|>',
         None, [("search", NESTED)]),
        ("final_answer", None,
         "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final"
         "<|message|>It is 21 °C in Paris.<|return|>",
         "It is 21 °C in Paris.", []),
        ("builtin_tool", None,
         '<|channel|>analysis to=browser.search code<|message|>{"query": "x"}<|call|>',
         None, []),
    ],
}

MALFORMED = {
    "hermes": [
        ("truncated", None,
         'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
         'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', []),
        ("garbage", None, "<tool_call>\nnot json\n</tool_call>\nDone.",
         "<tool_call>\nnot json\n</tool_call>\nDone.", []),
        ("unknown_function", TOOLS,
         '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
         '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', []),
        ("bad_then_good", None,
         '<tool_call>{"name": 1}</tool_call>\n<tool_call>{"name": "f", "arguments": {}}'
         "</tool_call>",
         '<tool_call>{"name": 1}</tool_call>', ["f"]),
        ("no_end_tag", None, '<tool_call>{"name": "f", "arguments": {}}',
         '<tool_call>{"name": "f", "arguments": {}}', []),
        ("arguments_not_object", None,
         '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
         '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', []),
        ("trailing_garbage_in_tag", None,
         '<tool_call>{"name": "f", "arguments": {"a": 1}} oops</tool_call>',
         '<tool_call>{"name": "f", "arguments": {"a": 1}} oops</tool_call>', []),
    ],
    "llama3_json": [
        ("truncated", None, '{"name": "get_weather", "parameters": {"city": "Pa',
         '{"name": "get_weather", "parameters": {"city": "Pa', []),
        ("not_a_call", None, '{"title": "a JSON answer"}', '{"title": "a JSON answer"}', []),
        ("unknown_function", TOOLS, '{"name": "rm_rf", "parameters": {}}',
         '{"name": "rm_rf", "parameters": {}}', []),
        ("good_then_truncated", None,
         '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"x": ',
         '{"name": "g", "parameters": {"x": ', ["f"]),
    ],
    "mistral": [
        ("truncated_list", None, '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"ci',
         '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"ci', []),
        ("truncated_named", None, 'Hi[TOOL_CALLS]get_weather[ARGS]{"city": "Pa',
         'Hi[TOOL_CALLS]get_weather[ARGS]{"city": "Pa', []),
        ("garbage", None, "[TOOL_CALLS] hello world", "[TOOL_CALLS] hello world", []),
        ("unknown_function", TOOLS, "[TOOL_CALLS]rm_rf[ARGS]{}", "[TOOL_CALLS]rm_rf[ARGS]{}", []),
        ("list_element_not_call", None,
         '[TOOL_CALLS] [{"name": "f", "arguments": {}}, 42]',
         '[TOOL_CALLS] [{"name": "f", "arguments": {}}, 42]', []),
    ],
    "qwen3_coder": [
        ("truncated", None,
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", []),
        ("missing_function_end", None,
         "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>",
         "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>", []),
        ("unknown_function", TOOLS,
         "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>",
         "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>", []),
        ("garbage", None, "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
         "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", []),
    ],
    "pythonic": [
        ("truncated", None, '[get_weather(city="Par', '[get_weather(city="Par', []),
        ("not_calls", None, "[1, 2, 3] are numbers", "[1, 2, 3] are numbers", []),
        ("positional", None, "[f(1)]", "[f(1)]", []),
        ("not_json", None, "[f(a={1, 2})]", "[f(a={1, 2})]", []),
        ("not_literal", None, '[f(a=os.system("ls"))]', '[f(a=os.system("ls"))]', []),
        ("unknown_function", TOOLS, "[get_time(), rm_rf()]", "[get_time(), rm_rf()]", []),
        ("content_before", None, "Sure: [get_time()]", "Sure: [get_time()]", []),
    ],
    "openai": [
        ("truncated", None,
         '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Par',
         '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Par',
         []),
        ("garbage", None,
         "<|channel|>commentary to=functions.f <|constrain|>json<|message|>not json<|call|>",
         "<|channel|>commentary to=functions.f <|constrain|>json<|message|>not json<|call|>", []),
        ("unknown_function", TOOLS,
         "<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{}<|call|>",
         "<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{}<|call|>", []),
        ("arguments_not_object", None,
         "<|channel|>commentary to=functions.f <|constrain|>json<|message|>[1, 2]<|call|>",
         "<|channel|>commentary to=functions.f <|constrain|>json<|message|>[1, 2]<|call|>", []),
        ("bad_then_good", None,
         "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{oops<|call|>"
         "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>"
         "{}<|call|>",
         "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{oops<|call|>", ["f"]),
    ],
}
