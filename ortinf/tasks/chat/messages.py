"""A conversation's messages as OpenAI's chat API writes them (what LLM.chat, `ortinf chat` and the server's
routes all read): roles, text and image parts, tool calls and their results. Validated by pydantic; what a
client sends back with an earlier reply (refusal, annotations, audio) is accepted and not read."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ortinf.errors import RequestError

STRICT = ConfigDict(extra="forbid")


IMAGE_PARTS = ("image_url", "input_image")  # chat's part, and the Responses API's


class ContentPart(BaseModel):
    """A part of a message's content: text is read; a refusal part (an earlier reply's) is skipped; an image
    (`image_url`: a data URL, `detail` accepted) becomes the model's image placeholder on a vision-language
    model and a 400 on a text model; audio and files are a 400."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None
    refusal: str | None = None
    image_url: str | dict | None = None

    def read(self, image_placeholder: str | None = None) -> str:
        if self.type in ("text", "input_text", "output_text") and self.text is not None:
            return self.text
        if self.type == "refusal":
            return ""
        if self.type in ("text", "input_text", "output_text"):
            raise RequestError("a text content part needs its text", param="messages")
        if self.type in IMAGE_PARTS and image_placeholder is not None:
            return image_placeholder
        what = "this model reads text" if self.type in IMAGE_PARTS else "send text or image_url parts"
        raise RequestError(f"content parts of type '{self.type[:40]}' are not supported: {what}", param="messages")

    def url(self) -> str | None:
        """An image part's URL (chat's {"url": ...} or the Responses API's string), else None."""
        if self.type not in IMAGE_PARTS:
            return None
        url = self.image_url.get("url") if isinstance(self.image_url, dict) else self.image_url
        if not isinstance(url, str) or not url:
            raise RequestError("an image part needs its image_url.url (a data: URL with the image in base64)", param="messages")
        return url


class FunctionCall(BaseModel):
    model_config = STRICT

    name: str
    arguments: str = Field(description="the arguments as JSON text")


class ToolCallIn(BaseModel):
    model_config = STRICT

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(BaseModel):
    model_config = STRICT

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str | None = None
    parameters: dict | None = Field(None, description="a JSON schema of the arguments object")
    strict: bool | None = None


class Tool(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = STRICT

    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: NamedFunction


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    # what the openai SDK and LangChain send back with an earlier reply: accepted, not read
    refusal: str | None = None
    annotations: list | None = None
    audio: dict | None = None
    function_call: dict | None = None
    reasoning_content: str | None = Field(None, description="an earlier reply's reasoning (vLLM's); not shown to the template")
    reasoning: str | None = None

    def text(self, image_placeholder: str | None = None) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.read(image_placeholder) for part in self.content)

    def image_urls(self) -> list[str]:
        """The URLs of the message's image parts, in order."""
        if not isinstance(self.content, list):
            return []
        return [url for url in (part.url() for part in self.content) if url is not None]
