'use strict';
// What the agent remembers about you, and the MCP servers its profiles reach. Reads your memory
// (SessionStore.GetMemory), adds an entry when given one (EditMemory), lists the writes held for your
// approval (a conversation that took in outside content cannot write to memory on its own: approve
// one with ApproveMemoryWrite, drop it with RejectMemoryWrite), then lists each profile's MCP servers
// with their state and tools (Agent.ListProfiles). Prints JSON lines.
// Usage: node memory-and-mcp.js ["a fact to remember"]   (PALIMPSEST_TOKEN says whose memory it is)

const { agent, sessionStore, call } = require('./index');

const entryLine = (e) => ({ id: e.id, text: e.text, session_id: e.session_id });
const heldLine = (w) => ({ id: w.id, action: w.action, text: w.text, old_text: w.old_text, session_id: w.session_id });

async function main() {
  const fact = process.argv.slice(2).join(' ').trim();
  const store = sessionStore();
  const agentClient = agent();
  try {
    const memory = await call(store, 'GetMemory', {});
    console.log(JSON.stringify({
      memory: { revision: memory.revision, entries: memory.entries.map(entryLine), chars: memory.chars,
                max_chars: memory.max_chars, max_entries: memory.max_entries },
    }));
    if (fact) {
      // expected_revision: ABORTED, rather than a lost update, if the memory changed since it was read.
      const added = await call(store, 'EditMemory', {
        action: 'MEMORY_ACTION_ADD', text: fact, expected_revision: memory.revision,
      });
      console.log(JSON.stringify({ added: { revision: added.revision, entry: entryLine(added.entry) } }));
    }
    console.log(JSON.stringify({ pending: memory.pending.map(heldLine) }));

    const listed = await call(agentClient, 'ListProfiles', {});
    for (const profile of listed.profiles) {
      if (profile.mcp_servers.length === 0) continue;
      console.log(JSON.stringify({
        profile: profile.id,
        mcp_servers: profile.mcp_servers.map((s) => ({
          name: s.name, target: s.target, state: s.state, error: s.error, tools: s.tools,
          skipped_tools: s.skipped_tools,
        })),
      }));
    }
  } finally {
    store.close();
    agentClient.close();
  }
}

main().catch((err) => {
  console.error(`node memory-and-mcp: ${err.message}`);
  process.exit(1);
});
