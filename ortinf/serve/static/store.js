// The chat page's conversations, kept in this browser's localStorage (one key holds them all). Each write reads the
// stored list afresh and changes only its own conversation, so two tabs do not undo each other's conversations.
//   conversation: { id, title, created, updated, messages: [message] }
//   message: { role: "user", content, image? } | { role: "assistant", content, reasoning?, model, stats?, error? }
"use strict";

const Store = (() => {
  const KEY = "ortinf-conversations", CURRENT = "ortinf-conversation";

  function all() {
    try {
      const stored = JSON.parse(localStorage.getItem(KEY) || "[]");
      return Array.isArray(stored) ? stored.filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages)) : [];
    } catch (error) { return []; }
  }

  function write(conversations) {
    try { localStorage.setItem(KEY, JSON.stringify(conversations)); return null; }
    catch (error) { return "this browser's storage is full: delete or export some conversations (images take the most room)"; }
  }

  /** Every conversation, the latest changed first. */
  function list() { return all().sort((a, b) => b.updated - a.updated); }

  function get(id) { return all().find((c) => c.id === id) || null; }

  /** A new conversation, not stored until it has a message. */
  function create() {
    const id = crypto.randomUUID ? crypto.randomUUID() : Date.now().toString(36) + Math.random().toString(36).slice(2);
    return { id, title: "", created: Date.now(), updated: Date.now(), messages: [] };
  }

  /** Stores `conversation` (titled by its first message when it has no title yet); null, or why it could not be. */
  function save(conversation) {
    if (!conversation.messages.length) return null;
    if (!conversation.title) {
      const first = conversation.messages.find((m) => m.role === "user");
      conversation.title = first ? String(first.content).replace(/\s+/g, " ").trim().slice(0, 60) || "Image" : "Conversation";
    }
    conversation.updated = Date.now();
    const stored = all().filter((c) => c.id !== conversation.id);
    return write([...stored, conversation]);
  }

  function rename(id, title) {
    const stored = all();
    const conversation = stored.find((c) => c.id === id);
    if (!conversation || !title.trim()) return null;
    conversation.title = title.trim().slice(0, 200);
    return write(stored);
  }

  function remove(id) { return write(all().filter((c) => c.id !== id)); }

  /** The conversation as a JSON document (what Export downloads). */
  function exportJSON(conversation) {
    const { title, created, updated, messages } = conversation;
    return JSON.stringify({ format: "ortinf-chat", version: 1, title, created: new Date(created).toISOString(),
                            updated: new Date(updated).toISOString(), messages }, null, 2);
  }

  const current = { get: () => localStorage.getItem(CURRENT), set: (id) => localStorage.setItem(CURRENT, id) };

  return { list, get, create, save, rename, remove, exportJSON, current };
})();
