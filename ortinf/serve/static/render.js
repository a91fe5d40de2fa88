// The chat page's renderer: a model's text to safe HTML. Markdown (marked), math (KaTeX: $...$, $$...$$, \(...\),
// \[...\]), code highlighted (highlight.js) with a copy button, and DOMPurify over the whole result: nothing the model
// writes reaches the DOM unsanitized. HTML in the model's text is shown as text, not obeyed.
"use strict";

const Render = (() => {
  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const escape = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);

  function tex(source, displayMode) {
    if (typeof katex === "undefined") return escape(source);
    // trust: false keeps \href, \url and \htmlX out; a formula KaTeX cannot read shows as its source, in red
    return katex.renderToString(source, { displayMode, throwOnError: false, trust: false, maxSize: 50, maxExpand: 500 });
  }

  function highlight(code, language) {
    if (typeof hljs === "undefined") return escape(code);
    if (language && hljs.getLanguage(language)) return hljs.highlight(code, { language, ignoreIllegals: true }).value;
    return code.length < 20000 ? hljs.highlightAuto(code).value : escape(code);
  }

  // $...$ opens on no space and closes on no space, not before a digit (so "$5 and $10" stays money)
  const INLINE_MATH = [/^\$\$([^$]+?)\$\$/, /^\\\[([\s\S]+?)\\\]/, /^\\\(([\s\S]+?)\\\)/, /^\$(?![\s$])((?:\\.|[^\\$\n])+?)(?<!\s)\$(?!\d)/];
  const math = [
    {
      name: "blockMath", level: "block",
      start: (src) => src.match(/^ {0,3}(?:\$\$|\\\[)/m)?.index,
      tokenizer(src) {
        const m = /^ {0,3}(?:\$\$([\s\S]+?)\$\$|\\\[([\s\S]+?)\\\])[ \t]*(?:\n+|$)/.exec(src);
        if (m) return { type: "blockMath", raw: m[0], text: (m[1] ?? m[2]).trim() };
      },
      renderer: (token) => `<div class="math">${tex(token.text, true)}</div>\n`,
    },
    {
      name: "inlineMath", level: "inline",
      start: (src) => src.match(/\$|\\\(|\\\[/)?.index,
      tokenizer(src) {
        for (const [i, pattern] of INLINE_MATH.entries()) {
          const m = pattern.exec(src);
          if (m) return { type: "inlineMath", raw: m[0], text: m[1].trim(), display: i < 2 };
        }
      },
      renderer: (token) => tex(token.text, token.display),
    },
  ];

  const markdown = new marked.Marked({ gfm: true, breaks: true });
  markdown.use({
    extensions: math,
    renderer: {
      html: (token) => (token.block ? `<p>${escape(token.text)}</p>\n` : escape(token.text)),
      code({ text, lang }) {
        const language = (lang || "").match(/^\S*/)[0];
        const named = language ? ` language-${escape(language)}` : "";
        return `<pre><code class="hljs${named}">${highlight(text, language)}</code></pre>\n`;
      },
    },
  });

  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A" && node.hasAttribute("href")) {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });
  const PURIFY = { ADD_ATTR: ["target"], FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe"] };

  /** The sanitized HTML of a model's Markdown `text`. */
  function html(text) {
    let rendered;
    try { rendered = markdown.parse(String(text)); } catch (error) { rendered = `<p>${escape(text)}</p>`; }
    return DOMPurify.sanitize(rendered, PURIFY);
  }

  /** Renders `text` into `element`, each code block under a bar with its language and a copy button. */
  function into(element, text) {
    element.innerHTML = html(text);
    for (const pre of element.querySelectorAll("pre")) {
      const bar = document.createElement("div");
      bar.className = "code-bar";
      const language = document.createElement("span");
      language.textContent = ((pre.querySelector("code")?.className || "").match(/language-(\S+)/) || [, ""])[1];
      const copy = document.createElement("button");
      copy.type = "button";
      copy.className = "copy";
      copy.textContent = "Copy";
      copy.addEventListener("click", () => copyText(pre.textContent, copy));
      bar.append(language, copy);
      const frame = document.createElement("div");
      frame.className = "code";
      pre.replaceWith(frame);
      frame.append(bar, pre);
    }
  }

  async function copyText(text, button) {
    try {
      if (navigator.clipboard) await navigator.clipboard.writeText(text);
      else {  // a page served over plain HTTP from another host has no clipboard API
        const area = Object.assign(document.createElement("textarea"), { value: text });
        document.body.append(area);
        area.select();
        document.execCommand("copy");
        area.remove();
      }
      if (button) button.textContent = "Copied";
    } catch (error) {
      if (button) button.textContent = "Copy failed";
    }
    if (button) setTimeout(() => { button.textContent = "Copy"; }, 1500);
  }

  /** A reply's reasoning and answer: the text inside <think>...</think> (or before a lone </think>: the template
   *  opened it) is reasoning; an unclosed <think> is reasoning still being written. */
  function splitThink(text) {
    const open = text.indexOf("<think>"), close = text.indexOf("</think>");
    if (open >= 0 && (close < 0 || close > open)) {
      const end = close < 0 ? text.length : close;
      return { reasoning: text.slice(open + 7, end).trim(), answer: (text.slice(0, open) + text.slice(end + 8)).trim(), open: close < 0 };
    }
    if (close >= 0) return { reasoning: text.slice(0, close).trim(), answer: text.slice(close + 8).trim(), open: false };
    return { reasoning: "", answer: text, open: false };
  }

  return { html, into, splitThink, copyText, escape };
})();
