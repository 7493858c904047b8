// node's fetch through the regular proxy over HTTPS. Node 20's built-in fetch ignores
// HTTP(S)_PROXY, so the request carries a dispatcher: undici's ProxyAgent (from npm, path in
// $UNDICI) pointed at HTTPS_PROXY. The per-run CA is trusted via NODE_EXTRA_CA_CERTS, which node
// reads at startup. Usage: UNDICI=.../node_modules/undici node fetch_agent.cjs URL OUTFILE
const { ProxyAgent } = require(process.env.UNDICI);
const { writeFileSync } = require("node:fs");

async function main() {
  const [url, out] = process.argv.slice(2);
  const dispatcher = new ProxyAgent(process.env.HTTPS_PROXY);
  const body = JSON.stringify({ model: "gpt-node", stream: true, messages: [{ role: "user", content: "hi" }] });
  const res = await fetch(url, {  // the global fetch, node's own
    method: "POST", dispatcher, body,
    headers: { "content-type": "application/json", authorization: `Bearer ${process.env.OPENAI_API_KEY}` },
  });
  let text = "";
  const decoder = new TextDecoder();
  for await (const chunk of res.body) text += decoder.decode(chunk, { stream: true });
  const got = await fetch(url.replace(/\/v1\/.*/, "/bytes/4096"), { dispatcher });
  writeFileSync(out, JSON.stringify({ status: res.status, body: text, bytes: (await got.arrayBuffer()).byteLength }));
}
main().catch((e) => { console.error(e); process.exit(1); });
