'use strict';
// Clients for Palimpsest's three services, built from the .proto contract at runtime
// (@grpc/proto-loader): the protos stay the single source, with no generated code to keep in step.

const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'protos');
const PROTO_DIR = path.join(PROTO_ROOT, 'palimpsest', 'v1');

// The same variables and defaults the services and `pal` read.
const ENDPOINTS = {
  store: { service: 'SessionStore', env: 'PALIMPSEST_STORE_ADDR', fallback: '127.0.0.1:50051' },
  compressor: { service: 'Compressor', env: 'PALIMPSEST_COMPRESSOR_ADDR', fallback: '127.0.0.1:50052' },
  agent: { service: 'Agent', env: 'PALIMPSEST_AGENT_ADDR', fallback: '127.0.0.1:50053' },
};

// Large enough for pasted images and long histories; the services use the same limit.
const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;

let cachedPackage = null;

/** The `palimpsest.v1` package: service constructors and message types, loaded once. */
function loadPackage() {
  if (cachedPackage === null) {
    const files = fs.readdirSync(PROTO_DIR)
      .filter((name) => name.endsWith('.proto'))
      .map((name) => path.join('palimpsest', 'v1', name));
    const definition = protoLoader.loadSync(files, {
      includeDirs: [PROTO_ROOT],
      keepCase: true, // field names as the .proto spells them, like `pal --json` and grpcurl
      longs: String, // int64 as strings: JavaScript numbers lose precision past 2^53
      enums: String,
      defaults: true,
      oneofs: true, // `event.event` names the member of the AgentEvent oneof that is set
    });
    cachedPackage = grpc.loadPackageDefinition(definition).palimpsest.v1;
  }
  return cachedPackage;
}

/** Where each service listens, from the environment. */
function addresses(env = process.env) {
  const out = {};
  for (const [key, endpoint] of Object.entries(ENDPOINTS)) {
    out[key] = (env[endpoint.env] || '').trim() || endpoint.fallback;
  }
  return out;
}

/** `authorization: Bearer <PALIMPSEST_TOKEN>` when a token is set (auth on), else empty metadata. */
function credentials(env = process.env) {
  const metadata = new grpc.Metadata();
  const token = (env.PALIMPSEST_TOKEN || '').trim();
  if (token) metadata.set('authorization', `Bearer ${token}`);
  return metadata;
}

function channelTarget(address) {
  const replicas = address.split(',').map((part) => part.trim()).filter(Boolean);
  // Several Compressor replicas: one channel balancing over all of them.
  return replicas.length > 1 ? `ipv4:${replicas.join(',')}` : replicas[0];
}

function makeClient(key, address) {
  const endpoint = ENDPOINTS[key];
  const target = address || addresses()[key];
  const Service = loadPackage()[endpoint.service];
  const client = new Service(channelTarget(target), grpc.credentials.createInsecure(), {
    'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
    'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
    'grpc.service_config': JSON.stringify({ loadBalancingConfig: [{ round_robin: {} }] }),
  });
  client.palimpsest = { service: endpoint.service, address: target };
  return client;
}

const sessionStore = (address) => makeClient('store', address);
const compressor = (address) => makeClient('compressor', address);
const agent = (address) => makeClient('agent', address);

/** One readable line for a failed call, naming the service and what to do. */
function describeError(err, client) {
  const where = client && client.palimpsest ? `the ${client.palimpsest.service} at ${client.palimpsest.address}` : 'the service';
  if (err && err.code === grpc.status.UNAVAILABLE && /failed to connect|connection refused|No connection established|ECONNREFUSED/i.test(err.details || '')) {
    return `cannot reach ${where}: is it running? (make run)`;
  }
  if (err && typeof err.code === 'number') {
    const name = Object.keys(grpc.status).find((key) => grpc.status[key] === err.code) || String(err.code);
    return `${where} answered ${name}: ${err.details || err.message}`;
  }
  return String(err && err.message ? err.message : err);
}

/** A unary call as a promise; failures reject with an Error whose message is describeError's line. */
function call(client, method, request, { deadlineSeconds = 60 } = {}) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + deadlineSeconds * 1000);
    client[method](request, credentials(), { deadline }, (err, response) => {
      if (err) {
        const failure = new Error(describeError(err, client));
        failure.code = err.code;
        reject(failure);
      } else {
        resolve(response);
      }
    });
  });
}

/** A server-streaming call: `onEvent` sees every message; resolves when the stream ends. */
function stream(client, method, request, onEvent) {
  return new Promise((resolve, reject) => {
    const callStream = client[method](request, credentials());
    callStream.on('data', onEvent);
    callStream.on('error', (err) => {
      const failure = new Error(describeError(err, client));
      failure.code = err.code;
      reject(failure);
    });
    callStream.on('end', resolve);
  });
}

module.exports = {
  PROTO_ROOT,
  loadPackage,
  addresses,
  credentials,
  sessionStore,
  compressor,
  agent,
  call,
  stream,
  describeError,
};
