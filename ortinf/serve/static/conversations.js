// The chat page's list of conversations (chat.html's sidebar): open, rename, export as JSON, delete, start a new one.
// The conversations themselves are store.js's; `conversation` (the open one) and the painting are chat.js's.
"use strict";

function showList() {
  const items = Store.list().map((c) => {
    const item = element("li", "conversation" + (conversation && c.id === conversation.id ? " active" : ""));
    item.dataset.id = c.id;
    item.append(button("title", c.title, c.title, () => openConversation(c.id)),
                button("rename", "✎", "Rename", () => startRename(item, c)),
                button("export", "⤓", "Export as JSON", () => exportConversation(c.id)),
                button("delete", "✕", "Delete", () => deleteConversation(c)));
    return item;
  });
  $("conversations").replaceChildren(...items);
}

function startRename(item, c) {
  const input = element("input", "rename-input");
  input.value = c.title;
  item.querySelector(".title").replaceWith(input);
  input.focus();
  input.select();
  let done = false;
  const finish = (keep) => {
    if (done) return;
    done = true;
    if (keep && input.value.trim()) {
      stored(Store.rename(c.id, input.value));
      if (conversation.id === c.id) conversation.title = input.value.trim().slice(0, 200);
    }
    showList();
  };
  input.addEventListener("keydown", (e) => { if (e.key === "Enter") finish(true); else if (e.key === "Escape") finish(false); });
  input.addEventListener("blur", () => finish(true));
}

function exportConversation(id) {
  const c = id === conversation.id ? conversation : Store.get(id);
  if (!c) return;
  const link = element("a");
  link.href = URL.createObjectURL(new Blob([Store.exportJSON(c)], { type: "application/json" }));
  link.download = (c.title.replace(/[^\w .-]+/g, "_").trim() || "conversation") + ".json";
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

function deleteConversation(c) {
  if (!confirm(`Delete the conversation "${c.title}"?`)) return;
  if (c.id === conversation.id) {
    conversation.deleted = true;  // a reply still streaming into it is not stored
    if (controller) controller.abort();
  }
  stored(Store.remove(c.id));
  if (c.id === conversation.id) newConversation();
  else showList();
}

function openConversation(id) {
  if (controller) controller.abort();
  const found = Store.get(id);
  if (!found) return showList();
  conversation = found;
  Store.current.set(id);
  showMessages();
  showList();
}

function newConversation() {
  if (controller) controller.abort();
  conversation = Store.create();
  Store.current.set(conversation.id);
  showMessages();
  showList();
}
