// The TypeScript SDK's Streamable HTTP client against mcpd: lists the tools, calls files/read and
// reads the resource, then prints one JSON object. Usage: node ts_sdk_client.mjs URL TOKEN PATH
// (the CA comes from NODE_EXTRA_CA_CERTS). Resolved from MCPD_TEST_NODE_DIR's node_modules.
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.env.MCPD_TEST_NODE_DIR, "node_modules", "x.js"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");

const [url, token, file] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "mcpd-test", version: "1.0.0" });
await client.connect(transport);
const tools = await client.listTools();
const called = await client.callTool({ name: "files/read", arguments: { path: file } });
const missing = await client.callTool({ name: "files/read", arguments: { path: file + ".missing" } });
const read = await client.readResource({ uri: `file://${file}` });
const out = {
  protocolVersion: transport.protocolVersion,
  sessionId: transport.sessionId,
  tools: tools.tools.map((t) => t.name),
  text: called.content[0].text,
  missing: missing.structuredContent.error.code,
  resource: read.contents[0].text,
};
await transport.terminateSession();
await client.close();
console.log(JSON.stringify(out));
