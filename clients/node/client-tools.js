'use strict';
// A turn with a tool the client offers: the model may call `local_time`, the stream asks for it with a
// tool_call_requested event, and this client answers with SubmitToolResult (another call, which could
// come from anywhere). Prints each event as a JSON line. Usage: node client-tools.js ["message"].

const { agent, call, stream } = require('./index');

const LOCAL_TIME = {
  name: 'local_time',
  description: "The time on the user's computer, in a time zone the model names.",
  parameters_json: JSON.stringify({
    type: 'object',
    properties: { zone: { type: 'string', description: 'An IANA time zone, e.g. Europe/Paris' } },
    required: ['zone'],
  }),
  read_only: true, // it only reads: allowed even in a conversation that took in outside content
};

function localTime(args) {
  const time = new Date().toLocaleString('en-GB', { timeZone: args.zone, hour12: false });
  return { content: `${time} (${args.zone})`, is_error: false };
}

async function main() {
  const text = process.argv.slice(2).join(' ') || 'What time is it in Paris?';
  const agentClient = agent();
  const answers = [];
  try {
    let end = null;
    await stream(agentClient, 'RunStream', { text, client_tools: [LOCAL_TIME] }, (event) => {
      console.log(JSON.stringify({ seq: event.seq, kind: event.event, [event.event]: event[event.event] }));
      if (event.event === 'tool_call_requested') {
        const asked = event.tool_call_requested;
        let result;
        try {
          result = localTime(JSON.parse(asked.arguments_json));
        } catch (err) {
          result = { content: `local_time failed: ${err.message}`, is_error: true };
        }
        answers.push(call(agentClient, 'SubmitToolResult', {
          session_id: event.session_id, turn_id: event.turn_id, call_id: asked.call_id, ...result,
        }));
      }
      if (event.event === 'stream_end' && !event.is_subagent) end = event.stream_end;
    });
    await Promise.all(answers);
    if (end === null) throw new Error('the Agent closed the stream before the turn ended');
  } finally {
    agentClient.close();
  }
}

main().catch((err) => {
  console.error(`node client-tools: ${err.message}`);
  process.exit(1);
});
