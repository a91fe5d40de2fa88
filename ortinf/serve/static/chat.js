// The chat page (served at /): it talks to this server's OpenAI routes (/v1/models, /tokenize, /v1/chat/completions,
// streamed) with the API key when one is set. Conversations live in this browser (store.js); replies are rendered by
// render.js; what does not fit the model's context is left out, oldest turns first (fit below).
"use strict";

const $ = (id) => document.getElementById(id);
let models = [], controller = null, image = null, conversation = null;

for (const [id, key] of [["api-key", "ortinf-api-key"], ["system", "ortinf-system"], ["temperature", "ortinf-temperature"]]) {
  const saved = localStorage.getItem(key);
  if (saved !== null) $(id).value = saved;
  $(id).addEventListener("change", () => localStorage.setItem(key, $(id).value));
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(className, text, title, action) {
  const node = element("button", className, text);
  node.type = "button";
  if (title) { node.title = title; node.setAttribute("aria-label", title); }
  node.addEventListener("click", action);
  return node;
}

function headers() {
  const h = { "Content-Type": "application/json" };
  if ($("api-key").value) h["Authorization"] = "Bearer " + $("api-key").value;
  return h;
}

function status(text, bad = false) {
  $("note").textContent = text;
  $("status").className = bad ? "bad" : "";
}

function stored(problem) { if (problem) status(problem, true); }

/** An Error with the server's message, and its code (context_length_exceeded, ...) as `code`. */
async function apiError(response) {
  let message = response.status + " " + response.statusText, code = null;
  try {
    const body = await response.json();
    const error = body.error || body;
    message = (typeof error === "string" ? error : error.message) || message;
    code = error.code || null;
  } catch (e) { /* not JSON: the status line says it */ }
  return Object.assign(new Error(message), { code, status: response.status });
}

async function loadModels() {
  const response = await fetch("/v1/models", { headers: headers() });
  if (response.status === 401) { $("settings").classList.add("open"); status("This server needs its API key: enter it in Settings.", true); return; }
  if (response.status === 503) { status("The model is loading…"); setTimeout(loadModels, 1000); return; }
  if (!response.ok) { status((await apiError(response)).message, true); return; }
  models = (await response.json()).data.filter((m) => m.task === "text-generation" || m.task === "text2text-generation");
  $("model").replaceChildren(...models.map((m) => new Option(m.id, m.id)));  // names as text
  const last = localStorage.getItem("ortinf-model");
  if (models.some((m) => m.id === last)) $("model").value = last;
  modelChanged();
  status(models.length ? "Ready." : "This server serves no chat model.", !models.length);
}

function current() { return models.find((m) => m.id === $("model").value); }

function modelChanged() {
  const model = current();
  localStorage.setItem("ortinf-model", $("model").value);
  const vision = !!model && (model.input_modalities || []).includes("image");
  $("attach").hidden = !vision;
  if (!vision) { image = null; $("attached").textContent = ""; }
}

function maxTokens() { return Number($("max-tokens").value) || 0; }

// ---- the messages

function showMessages() {
  $("messages").replaceChildren(...conversation.messages.map((m, i) => bubble(m, i)));
  markLeftOut();
  scroll(true);
}

function bubble(message, index) {
  const div = element("div", "message " + message.role);
  div.dataset.index = index;
  div.append(element("div", "who", message.role === "user" ? "You" : message.model || "assistant"));
  if (message.role === "user") {
    div.append(element("div", "content text", message.content));
    if (message.image) div.append(Object.assign(element("img"), { src: message.image, alt: "attached image" }));
  } else {
    div.append(element("div", "content"));
  }
  paint(div, message, false);
  return div;
}

/** Fills an assistant bubble from its message (again and again while it streams), and every bubble's actions. */
function paint(div, message, streaming) {
  if (message.role === "assistant") {
    const { reasoning: inline, answer, open } = Render.splitThink(message.content || "");
    const reasoning = [message.reasoning, inline].filter(Boolean).join("\n\n");
    let details = div.querySelector("details.reasoning");
    if (reasoning && !details) {
      details = element("details", "reasoning");
      details.append(element("summary"), element("div", "thoughts"));
      div.querySelector(".content").before(details);
    }
    if (details) {
      details.querySelector("summary").textContent = streaming && (open || !answer) ? "Thinking…" : "Thoughts";
      Render.into(details.querySelector(".thoughts"), reasoning);
    }
    Render.into(div.querySelector(".content"), answer);
    for (const old of div.querySelectorAll(".notice, .error, .stats")) old.remove();
    const stats = message.stats;
    if (stats && stats.left_out) {
      div.append(element("div", "notice", `${stats.left_out} earlier message${stats.left_out > 1 ? "s were" : " was"} left out: ` +
                                          `the conversation is longer than the model's context (${stats.max_model_len} tokens).`));
    }
    if (message.error) div.append(element("div", "error", message.error));
    if (stats) div.append(element("div", "stats", statsLine(stats)));
  }
  div.querySelector(".actions")?.remove();
  if (streaming) return;
  const index = Number(div.dataset.index), actions = element("div", "actions");
  if (message.role === "user") actions.append(button("edit", "Edit", "Edit and send again", () => startEdit(div, index)));
  else {
    actions.append(button("copy", "Copy", "Copy the reply", (e) => Render.copyText(Render.splitThink(message.content || "").answer, e.target)));
    if (index === conversation.messages.length - 1) actions.append(button("regenerate", "Regenerate", "Write this reply again", regenerate));
  }
  div.append(actions);
}

function statsLine(s) {
  const used = s.prompt_tokens != null ? s.prompt_tokens + (s.completion_tokens || 0) : null;
  return [s.completion_tokens != null ? s.completion_tokens + " tokens" : "",
          s.tokens_per_s ? s.tokens_per_s.toFixed(1) + " tokens/s" : "",
          s.first_ms != null ? "first token " + s.first_ms + " ms" : "",
          used != null ? `context ${used}${s.max_model_len ? "/" + s.max_model_len : ""}` : "",
          s.finish || ""].filter(Boolean).join(" · ");
}

/** Dims the messages the latest reply was written without (left out to fit the context). */
function markLeftOut() {
  const last = [...conversation.messages].reverse().find((m) => m.role === "assistant" && m.stats);
  const cut = (last && last.stats.left_out) || 0;
  for (const div of $("messages").querySelectorAll(".message")) {
    const out = Number(div.dataset.index) < cut;
    div.classList.toggle("left-out", out);
    div.title = out ? "left out of the latest request: beyond the model's context" : "";
  }
}

function scroll(force = false) {
  const box = $("messages");
  if (force || box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
}

function busy(on) {
  $("send").hidden = on; $("stop").hidden = !on; $("input").disabled = on;
  for (const b of $("messages").querySelectorAll(".actions button:not(.copy)")) b.disabled = on;
}

function startEdit(div, index) {
  if (controller) return;
  const message = conversation.messages[index];
  const area = element("textarea", "edit-box");
  area.value = message.content;
  const editor = element("div", "editor");
  editor.append(area, button("primary resend", "Send", "Send the edited message (what came after it goes)", () => {
    if (!area.value.trim() && !message.image) return;
    conversation.messages = conversation.messages.slice(0, index);
    conversation.messages.push({ ...message, content: area.value.trim() });
    stored(Store.save(conversation));
    showMessages();
    reply();
  }), button("cancel", "Cancel", "", showMessages));
  div.querySelector(".content").hidden = true;
  div.querySelector(".actions").remove();
  div.append(editor);
  area.focus();
}

function regenerate() {
  if (controller) return;
  if (conversation.messages.at(-1)?.role === "assistant") conversation.messages.pop();
  if (conversation.messages.at(-1)?.role !== "user") return;
  showMessages();
  reply();
}

async function send() {
  const text = $("input").value.trim();
  if ((!text && !image) || controller || !current()) return;
  const message = { role: "user", content: text };
  if (image) message.image = image;
  image = null; $("attached").textContent = ""; $("input").value = "";
  conversation.messages.push(message);
  stored(Store.save(conversation));
  Store.current.set(conversation.id);
  showList();
  $("messages").lastElementChild && paint($("messages").lastElementChild, conversation.messages.at(-2), false);  // its Regenerate goes
  $("messages").append(bubble(message, conversation.messages.length - 1));
  await reply();
}

/** Writes the reply to the conversation's last (user) message, streamed into a new bubble, and stores it. */
async function reply() {
  const model = current(), owner = conversation;  // another conversation may be opened while this one streams
  if (!model) return status("Choose a model first.", true);
  const history = Fit.messages(owner.messages);
  const message = { role: "assistant", content: "", reasoning: "", model: model.id };
  owner.messages.push(message);
  const div = bubble(message, owner.messages.length - 1);
  paint(div, message, true);
  $("messages").append(div);
  scroll(true);
  controller = new AbortController();
  busy(true);
  const run = { started: performance.now(), first: null, usage: null, finish: null, left_out: 0 };
  let timer = null, painted = 0;  // painted at once, then at most every 40 ms (each paint renders the whole reply)
  const show = () => { clearTimeout(timer); timer = null; painted = performance.now(); paint(div, message, true); scroll(); };
  const repaint = () => {
    const since = performance.now() - painted;
    if (since >= 40) show();
    else if (!timer) timer = setTimeout(show, 40 - since);
  };
  try {
    const fitted = await Fit.fit(history, model, { system: $("system").value.trim(), maxTokens: maxTokens(), headers: headers(), signal: controller.signal });
    for (let k = fitted.k; ; k++) {
      run.left_out = k ? history[fitted.starts[k]].index : 0;
      try {
        await stream(Fit.wire(history, fitted.starts, k, $("system").value.trim()), model, message, run, repaint);
        break;
      } catch (error) {  // the server counts differently (images) or /tokenize was not there: leave one more turn out
        if (error.code !== "context_length_exceeded" || k + 1 >= fitted.starts.length) throw error;
      }
    }
  } catch (error) {
    if (error.name === "AbortError") run.finish = "stopped";
    else message.error = error.message;
  } finally {
    clearTimeout(timer);
    const seconds = (performance.now() - (run.first ?? run.started)) / 1000;
    const completion = run.usage ? run.usage.completion_tokens : null;
    message.stats = { completion_tokens: completion, prompt_tokens: run.usage ? run.usage.prompt_tokens : null,
                      tokens_per_s: completion > 1 && seconds > 0 ? (completion - 1) / seconds : null,  // after the first
                      first_ms: run.first ? Math.round(run.first - run.started) : null, finish: run.finish,
                      max_model_len: model.max_model_len || null, left_out: run.left_out };
    controller = null;
    if (!owner.deleted) stored(Store.save(owner));
    if (owner === conversation) {
      paint(div, message, false);
      markLeftOut();
    }
    busy(false);
    showList();
    $("input").focus();
    scroll();
  }
}

async function stream(messages, model, message, run, repaint) {
  const body = { model: model.id, messages, stream: true, stream_options: { include_usage: true },
                 temperature: Number($("temperature").value || 0.7) };
  if (maxTokens()) body.max_tokens = maxTokens();
  const response = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal });
  if (!response.ok) throw await apiError(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (!event.startsWith("data: ")) continue;
      const data = event.slice(6);
      if (data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || "the server failed the request");
      if (chunk.usage) run.usage = chunk.usage;
      let grew = false;
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        if (delta.reasoning_content) { message.reasoning += delta.reasoning_content; grew = true; }
        if (delta.content) { message.content += delta.content; grew = true; }
        if (choice.finish_reason) run.finish = choice.finish_reason;
      }
      if (grew) { run.first = run.first ?? performance.now(); repaint(); }
    }
  }
}

$("send").addEventListener("click", send);
$("stop").addEventListener("click", () => controller && controller.abort());
$("input").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); } });
$("model").addEventListener("change", modelChanged);
$("toggle-settings").addEventListener("click", () => $("settings").classList.toggle("open"));
$("toggle-list").addEventListener("click", () => $("sidebar").classList.toggle("open"));
$("clear").addEventListener("click", newConversation);
$("api-key").addEventListener("change", loadModels);
$("attach").addEventListener("click", () => $("file").click());
$("file").addEventListener("change", () => {
  const file = $("file").files[0];
  if (!file) return;
  const reader = new FileReader();
  reader.onload = () => { image = reader.result; $("attached").textContent = "attached: " + file.name; };
  reader.readAsDataURL(file);
  $("file").value = "";
});
window.addEventListener("storage", (e) => { if (e.key === "ortinf-conversations") showList(); });

conversation = Store.get(Store.current.get()) || Store.create();
showMessages();
showList();
loadModels();
