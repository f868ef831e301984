"""Writes the tool schemas real clients send (openai-python's pydantic_function_tool,
instructor's TOOLS mode, pydantic-ai's output tool) for nested and recursive pydantic models, as
crates/ferrum-structured/tests/data/client_tool_schemas.json: inputs for tests/tool_schemas.rs.
Run: pip install openai instructor pydantic-ai-slim; python scripts/client_tool_schemas.py > that file."""
import json, sys
from typing import List, Optional, Literal
from pydantic import BaseModel
import openai, instructor

class Address(BaseModel):
    street: str
    city: str

class Item(BaseModel):
    name: str
    quantity: int

class Order(BaseModel):
    customer: str
    address: Address
    items: List[Item]
    note: Optional[str] = None

class Node(BaseModel):
    label: str
    children: List["Node"] = []

out = {}
out["openai_pydantic_function_tool"] = openai.pydantic_function_tool(Order)
out["openai_recursive"] = openai.pydantic_function_tool(Node)
# instructor, Mode.TOOLS
from instructor.processing.response import handle_response_model
_, kw = handle_response_model(Order, mode=instructor.Mode.TOOLS, messages=[])
out["instructor_tools"] = kw["tools"][0]
# pydantic-ai output_type
from pydantic_ai import Agent
from pydantic_ai.models.function import FunctionModel, AgentInfo
from pydantic_ai.messages import ModelResponse, ToolCallPart
seen = {}
def fn(messages, info: AgentInfo):
    t = info.output_tools[0]
    seen["tool"] = {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters_json_schema}}
    return ModelResponse(parts=[ToolCallPart(t.name, {"customer": "a", "address": {"street": "s", "city": "c"}, "items": []})])
Agent(FunctionModel(fn), output_type=Order).run_sync("x")
out["pydantic_ai_output"] = seen["tool"]
json.dump(out, sys.stdout, indent=1)
