// What of a conversation the chat page sends: the whole of it when it fits the model's context (max_model_len, from
// /v1/models) with room for the reply, else its latest turns, oldest left out first. The server counts the tokens
// (/tokenize renders the messages through the model's chat template); a prompt-too-long 400 (code
// context_length_exceeded) makes the page leave one more turn out (chat.js).
"use strict";

const Fit = (() => {
  /** The conversation's messages in OpenAI's shape, each with its `index` in the conversation. A reply that failed is
   *  left out with the question it answered (a template may refuse two user turns in a row). */
  function messages(conversation) {
    const out = [];
    conversation.forEach((m, index) => {
      if (m.role === "assistant") {
        if (m.error) { if (out.length && out.at(-1).role === "user") out.pop(); return; }
        out.push({ role: "assistant", content: Render.splitThink(m.content || "").answer, index });
      } else {
        const content = m.image ? [{ type: "text", text: m.content }, { type: "image_url", image_url: { url: m.image } }] : m.content;
        out.push({ role: "user", content, index });
      }
    });
    return out;
  }

  /** The request's messages from turn `k` on (a turn starts at a user message), after the system prompt. */
  function wire(history, starts, k, system) {
    const kept = history.slice(starts[k] ?? 0).map(({ role, content }) => ({ role, content }));
    return system ? [{ role: "system", content: system }, ...kept] : kept;
  }

  async function count(messages, model, options) {
    try {
      const response = await fetch("/tokenize", { method: "POST", headers: options.headers, signal: options.signal,
                                                  body: JSON.stringify({ model: model.id, messages }) });
      return response.ok ? (await response.json()).count : null;
    } catch (error) {
      if (error.name === "AbortError") throw error;
      return null;
    }
  }

  /** { starts, k }: the turns' first messages, and the first turn to send (0: all of them). The reply's room is
   *  max_tokens when set, else a quarter of the context (at most 1,024 tokens). */
  async function fit(history, model, options) {
    const starts = history.map((m, i) => (m.role === "user" ? i : -1)).filter((i) => i >= 0);
    const limit = model.max_model_len;
    if (!limit || starts.length < 2) return { starts, k: 0 };
    const budget = limit - (options.maxTokens || Math.min(1024, Math.floor(limit / 4)));
    const fits = async (k) => {
      const n = await count(wire(history, starts, k, options.system), model, options);
      return n === null ? null : n <= budget;
    };
    const whole = await fits(0);
    if (whole !== false) return { starts, k: 0 };  // fits, or no count (the server's 400 says)
    let low = 1, high = starts.length - 1, k = high;  // the fewest turns left out: a binary search over k
    while (low <= high) {
      const middle = (low + high) >> 1;
      if (await fits(middle)) { k = middle; high = middle - 1; } else low = middle + 1;
    }
    return { starts, k };
  }

  return { messages, wire, fit };
})();
