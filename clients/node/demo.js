'use strict';
// Creates a session, streams one turn through the Agent printing each event as a JSON line, then
// lists the newest sessions of that profile. Usage: node demo.js ["message"]; addresses from the PALIMPSEST_*_ADDR variables.

const { sessionStore, agent, call, stream } = require('./index');

// Reasons that mean the turn did not do its job.
const FAILED = new Set(['STREAM_END_REASON_ERROR', 'STREAM_END_REASON_CONTEXT_TOO_LARGE']);

function eventLine(event) {
  const kind = event.event; // the oneof member that is set (proto-loader `oneofs: true`)
  return JSON.stringify({ session_id: event.session_id, seq: event.seq, kind, [kind]: event[kind] });
}

async function main() {
  const text = process.argv.slice(2).join(' ') || 'Hello from the Node.js client. What can you do?';
  const store = sessionStore();
  const agentClient = agent();
  try {
    // The Agent knows which profile is its default; PALIMPSEST_PROFILE picks another.
    const profileId = process.env.PALIMPSEST_PROFILE
      || (await call(agentClient, 'ListProfiles', {})).default_profile_id;
    const created = await call(store, 'CreateSession', { profile_id: profileId, name: 'node demo' });
    const sessionId = created.session.id;
    console.log(JSON.stringify({ created: { session_id: sessionId, profile_id: created.session.profile_id } }));

    let end = null;
    await stream(agentClient, 'RunStream', { session_id: sessionId, text }, (event) => {
      console.log(eventLine(event));
      if (event.event === 'stream_end' && !event.is_subagent) end = event.stream_end;
    });
    if (end === null) throw new Error('the Agent closed the stream before the turn ended');

    const listed = await call(store, 'ListSessions', { profile_id: profileId, page_size: 5 });
    for (const session of listed.sessions) {
      console.log(JSON.stringify({
        session: { id: session.id, name: session.name, messages: session.display_message_count, pinned: session.pinned },
      }));
    }
    console.log(JSON.stringify({ total_sessions: listed.total }));
    if (FAILED.has(end.reason)) throw new Error(`the turn ended with ${end.reason}`);
  } finally {
    store.close();
    agentClient.close();
  }
}

main().catch((err) => {
  console.error(`node demo: ${err.message}`);
  process.exit(1);
});
