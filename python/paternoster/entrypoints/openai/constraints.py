"""The structured-output constraint of an OpenAI request: one of
``structured_outputs``, ``response_format`` or vLLM's older ``guided_*``
fields, normalized, with the field it came from (which its errors name)."""

from __future__ import annotations

from typing import Any

from paternoster.entrypoints.openai.errors import bad_request
from paternoster.structured_outputs import normalize_spec

#: Key of the sampling fields carrying the field a constraint came from (popped
#: before the pipeline sees them; it names that field in the constraint's errors).
SOURCE_PARAM = "_constraint_param"


def structured_outputs(body: Any) -> dict[str, Any] | None:
    """The request's constraint, from ``structured_outputs``, OpenAI's
    ``response_format`` or vLLM's older ``guided_*`` fields (at most one of
    them), normalized (xgrammar parses it in the pipeline, off the event
    loop), with :data:`SOURCE_PARAM` naming the field it came from.

    Raises:
        APIError: 400 naming the field: two of them set, a ``json_schema``
            response format without a schema, or an invalid constraint.
    """
    sources: dict[str, dict[str, Any]] = {}
    if body.structured_outputs is not None:
        sources["structured_outputs"] = body.structured_outputs
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        sources["response_format"] = {"json_object": True}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise bad_request("response_format of type json_schema needs json_schema.schema",
                              "response_format")
        sources["response_format"] = {"json": fmt.json_schema.json_schema}
    for key in ("json", "regex", "choice", "grammar"):
        value = getattr(body, f"guided_{key}")
        if value is not None:
            sources[f"guided_{key}"] = {key: value}
    if not sources:
        return None
    if len(sources) > 1:
        names = sorted(sources)
        raise bad_request(f"set only one of {', '.join(names)}", names[1])
    (param, spec), = sources.items()
    try:
        spec = normalize_spec(spec)
    except ValueError as e:
        raise bad_request(str(e), param) from None
    return {**spec, SOURCE_PARAM: param}
