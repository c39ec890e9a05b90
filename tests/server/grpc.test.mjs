// kiln's KServe v2 gRPC endpoint (inference.GRPCInferenceService) through grpc-js, a client
// nobody here wrote, loading the repository's src/server/proto/grpc_service.proto.
//
// Environment (set by the harness that started the server):
//   KILN_GRPC_ADDR      host:port of the server (tests are skipped without it)
//   KILN_MODEL          the model to call (default "micro")
//   KILN_PLAN, KILN_BIN the model's plan and the kiln binary: expected texts come from
//                       `kiln run --plan KILN_PLAN --prompt ... --json`, never from this file
//   KILN_MODEL_CONTROL  "explicit" when RepositoryModelLoad/Unload are allowed (default "none")
//   KILN_API_KEY        sent as "authorization: Bearer <key>" when set
//
// Run: cd tests/server && npm ci && KILN_GRPC_ADDR=... node --test grpc.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

const ADDR = process.env.KILN_GRPC_ADDR;
const MODEL = process.env.KILN_MODEL ?? 'micro';
const CONTROL = process.env.KILN_MODEL_CONTROL ?? 'none';
const skip = ADDR ? false : 'KILN_GRPC_ADDR is not set (no server to test)';
const MAX_TOKENS = 6;

const protoDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../src/server/proto');
const definition = protoLoader.loadSync(path.join(protoDir, 'grpc_service.proto'), {
  includeDirs: [protoDir],
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});
const inference = grpc.loadPackageDefinition(definition).inference;
const client = ADDR
  ? new inference.GRPCInferenceService(ADDR, grpc.credentials.createInsecure())
  : null;

function metadata() {
  const m = new grpc.Metadata();
  if (process.env.KILN_API_KEY) m.set('authorization', `Bearer ${process.env.KILN_API_KEY}`);
  return m;
}

// A unary call as a promise; rejects with the grpc-js error (code, details).
function call(method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, metadata(), (err, response) => (err ? reject(err) : resolve(response)));
  });
}

async function rejectsWith(promise, code, needle) {
  await assert.rejects(promise, (err) => {
    assert.equal(err.code, code, `status ${err.code} (${err.details}), expected ${code}`);
    if (needle) assert.match(err.details, new RegExp(needle), err.details);
    return true;
  });
}

// Triton's raw BYTES: a 4-byte little-endian length before each element.
function encodeBytes(strings) {
  const parts = [];
  for (const s of strings) {
    const b = Buffer.from(s, 'utf8');
    const n = Buffer.alloc(4);
    n.writeUInt32LE(b.length);
    parts.push(n, b);
  }
  return Buffer.concat(parts);
}
function decodeBytes(buf) {
  const out = [];
  for (let o = 0; o < buf.length; ) {
    const n = buf.readUInt32LE(o);
    out.push(buf.subarray(o + 4, o + 4 + n).toString('utf8'));
    o += 4 + n;
  }
  return out;
}

// What `kiln run` generates for `prompt` with the same plan and token limit.
const expectedCache = new Map();
function kilnRun(prompt, maxTokens = MAX_TOKENS) {
  const key = `${maxTokens}\0${prompt}`;
  if (!expectedCache.has(key)) {
    const { KILN_BIN, KILN_PLAN } = process.env;
    assert.ok(KILN_BIN && KILN_PLAN, 'KILN_BIN and KILN_PLAN must name the kiln binary and plan');
    const args = ['run', '--plan', KILN_PLAN, '--prompt', prompt];
    const out = execFileSync(KILN_BIN, [...args, '--max-new-tokens', String(maxTokens), '--json'], {
      encoding: 'utf8',
    });
    expectedCache.set(key, JSON.parse(out.trim().split('\n').pop()));
  }
  return expectedCache.get(key);
}

function inferRequest(prompts, { raw = false, shape, parameters = {}, extraInputs = [] } = {}) {
  const input = {
    name: 'text_input',
    datatype: 'BYTES',
    shape: shape ?? [prompts.length],
  };
  const request = {
    model_name: MODEL,
    id: 'grpc-js-1',
    inputs: [input, ...extraInputs],
    parameters: { max_tokens: { int64_param: MAX_TOKENS }, ...parameters },
  };
  if (raw) request.raw_input_contents = [encodeBytes(prompts)];
  else input.contents = { bytes_contents: prompts.map((p) => Buffer.from(p, 'utf8')) };
  return request;
}

function textOf(response) {
  const i = response.outputs.findIndex((o) => o.name === 'text_output');
  assert.ok(i >= 0, 'no text_output in the response');
  if (response.raw_output_contents.length > 0) return decodeBytes(response.raw_output_contents[i]);
  return response.outputs[i].contents.bytes_contents.map((b) => b.toString('utf8'));
}

test('ServerLive and ServerReady', { skip }, async () => {
  assert.equal((await call('ServerLive', {})).live, true);
  assert.equal((await call('ServerReady', {})).ready, true);
});

test('ServerMetadata names kiln and its extensions', { skip }, async () => {
  const m = await call('ServerMetadata', {});
  assert.equal(m.name, 'kiln');
  assert.match(m.version, /\d/);
  assert.ok(m.extensions.includes('model_repository'), m.extensions.join(','));
});

test('ModelReady, ModelMetadata and ModelConfig', { skip }, async () => {
  assert.equal((await call('ModelReady', { name: MODEL })).ready, true);
  assert.equal((await call('ModelReady', { name: 'no-such-model' })).ready, false);
  const meta = await call('ModelMetadata', { name: MODEL });
  assert.equal(meta.name, MODEL);
  assert.ok(meta.versions.length >= 1);
  const input = meta.inputs.find((t) => t.name === 'text_input');
  assert.deepEqual([input.datatype, input.shape], ['BYTES', ['-1']]);
  const maxTokens = meta.inputs.find((t) => t.name === 'max_tokens');
  assert.deepEqual([maxTokens.datatype, maxTokens.shape], ['INT32', ['1']]);
  const output = meta.outputs.find((t) => t.name === 'text_output');
  assert.equal(output.datatype, 'BYTES');
  const { config } = await call('ModelConfig', { name: MODEL });
  assert.equal(config.name, MODEL);
  assert.equal(config.input[0].data_type, 'TYPE_STRING');
  assert.equal(config.output[0].name, 'text_output');
});

test('ModelInfer with bytes_contents gives kiln run\'s text', { skip }, async () => {
  const prompt = 'hello world';
  const r = await call('ModelInfer', inferRequest([prompt]));
  assert.equal(r.model_name, MODEL);
  assert.equal(r.id, 'grpc-js-1');
  assert.equal(r.raw_output_contents.length, 0);
  assert.deepEqual(r.outputs[0].shape, ['1']);
  assert.deepEqual(textOf(r), [kilnRun(prompt).text]);
  assert.equal(r.parameters.finish_reason.string_param, 'length');
});

test('ModelInfer with raw_input_contents answers raw, a batch of prompts alike', { skip }, async () => {
  const prompts = ['hello world', 'the cat sat'];
  const r = await call('ModelInfer', inferRequest(prompts, { raw: true, shape: [2, 1] }));
  assert.equal(r.raw_output_contents.length, 1);
  assert.deepEqual(r.outputs[0].shape, ['2', '1']);
  assert.equal(r.outputs[0].contents?.bytes_contents?.length ?? 0, 0);
  assert.deepEqual(textOf(r), prompts.map((p) => kilnRun(p).text));
});

test('parameter input tensors and the token_ids output', { skip }, async () => {
  const prompt = 'hello world';
  const maxTokens = {
    name: 'max_tokens',
    datatype: 'INT32',
    shape: [1],
    contents: { int_contents: [3] },
  };
  const request = inferRequest([prompt], {
    parameters: { return_token_ids: { bool_param: true } },
    extraInputs: [maxTokens],
  });
  // Given both ways, a parameter is refused as ambiguous.
  await rejectsWith(call('ModelInfer', request), grpc.status.INVALID_ARGUMENT, 'max_tokens');
  delete request.parameters.max_tokens;
  const r = await call('ModelInfer', request);
  const expected = kilnRun(prompt, 3);
  assert.deepEqual(textOf(r), [expected.text]);
  const ids = r.outputs.find((o) => o.name === 'token_ids');
  assert.equal(ids.datatype, 'INT64');
  assert.deepEqual(ids.contents.int64_contents.map(Number), expected.output_ids);
});

// Collects a stream's responses to one request: up to the one flagged triton_final_response.
function streamResponses(stream) {
  const queue = [];
  let wake = null;
  stream.on('data', (m) => {
    queue.push(m);
    if (wake) wake();
  });
  return async function next() {
    const responses = [];
    for (;;) {
      while (queue.length === 0) await new Promise((resolve) => (wake = resolve));
      const m = queue.shift();
      responses.push(m);
      if (m.infer_response?.parameters?.triton_final_response?.bool_param) return responses;
    }
  };
}

test('ModelStreamInfer: pieces concatenate to the whole text; errors keep the stream', { skip }, async () => {
  const prompt = 'hello world';
  const stream = client.ModelStreamInfer(metadata());
  const next = streamResponses(stream);

  stream.write(inferRequest([prompt]));
  const responses = await next();
  assert.ok(responses.length >= 2, `${responses.length} responses`);
  for (const m of responses) assert.equal(m.error_message, '');
  const finals = responses.map((m) => m.infer_response.parameters.triton_final_response.bool_param);
  assert.deepEqual(finals, [...Array(responses.length - 1).fill(false), true]);
  const pieces = responses.flatMap((m) => textOf(m.infer_response));
  assert.ok(pieces.slice(0, -1).every((p) => p.length > 0), JSON.stringify(pieces));
  assert.equal(pieces.join(''), kilnRun(prompt).text);

  // A bad request is an error message on the stream, which then serves the next request.
  stream.write(inferRequest([prompt], { parameters: { bogus: { string_param: 'x' } } }));
  const [error] = await next();
  assert.match(error.error_message, /bogus/);
  stream.write(inferRequest([prompt], { raw: true }));
  const again = await next();
  assert.equal(again.flatMap((m) => textOf(m.infer_response)).join(''), kilnRun(prompt).text);
  stream.end();
});

test('NOT_FOUND for an unknown model, INVALID_ARGUMENT for bad parameters', { skip }, async () => {
  const unknown = { ...inferRequest(['hi']), model_name: 'no-such-model' };
  await rejectsWith(call('ModelInfer', unknown), grpc.status.NOT_FOUND, 'no-such-model');
  await rejectsWith(call('ModelMetadata', { name: 'no-such-model' }), grpc.status.NOT_FOUND);
  const bogus = inferRequest(['hi'], { parameters: { bogus: { bool_param: true } } });
  await rejectsWith(call('ModelInfer', bogus), grpc.status.INVALID_ARGUMENT, 'bogus');
  const cold = inferRequest(['hi'], { parameters: { temperature: { double_param: -1 } } });
  await rejectsWith(call('ModelInfer', cold), grpc.status.INVALID_ARGUMENT, 'temperature');
  const malformed = inferRequest(['hi'], { raw: true });
  malformed.raw_input_contents = [Buffer.from([0x10, 0, 0, 0, 0x68, 0x69])];
  await rejectsWith(call('ModelInfer', malformed), grpc.status.INVALID_ARGUMENT, 'text_input');
});

test('garbage bytes to ModelInfer: an error status, and the server still answers', { skip }, async () => {
  const raw = new grpc.Client(ADDR, grpc.credentials.createInsecure());
  const identity = (b) => b;
  for (const garbage of [Buffer.alloc(12, 0xff), Buffer.from([0x0a, 0x64]), Buffer.from([0x2a, 5, 0x0a])]) {
    const err = await new Promise((resolve) => {
      raw.makeUnaryRequest(
        '/inference.GRPCInferenceService/ModelInfer',
        identity,
        identity,
        garbage,
        metadata(),
        {},
        (e) => resolve(e),
      );
    });
    assert.ok(err, 'garbage was answered without an error');
    assert.notEqual(err.code, grpc.status.OK);
  }
  raw.close();
  assert.equal((await call('ServerLive', {})).live, true);
});

test('ModelStatistics counts the inferences', { skip }, async () => {
  const { model_stats } = await call('ModelStatistics', { name: MODEL });
  assert.ok(model_stats.length >= 1);
  const s = model_stats[0];
  assert.equal(s.name, MODEL);
  assert.ok(Number(s.inference_count) > 0, s.inference_count);
  assert.ok(Number(s.execution_count) > 0, s.execution_count);
  assert.ok(Number(s.inference_stats.success.count) > 0);
  assert.ok(Number(s.last_inference) > Date.now() - 3600e3, s.last_inference);
});

test('RepositoryIndex, RepositoryModelUnload and RepositoryModelLoad', { skip }, async () => {
  const index = await call('RepositoryIndex', {});
  const entry = index.models.find((m) => m.name === MODEL);
  assert.equal(entry?.state, 'READY', JSON.stringify(index.models));
  if (CONTROL !== 'explicit') {
    // Triton refuses explicit loads unless started with explicit model control.
    await rejectsWith(call('RepositoryModelLoad', { model_name: MODEL }), grpc.status.UNAVAILABLE);
    return;
  }
  await call('RepositoryModelUnload', { model_name: MODEL });
  assert.equal((await call('ModelReady', { name: MODEL })).ready, false);
  const after = await call('RepositoryIndex', {});
  assert.equal(after.models.find((m) => m.name === MODEL)?.state, 'UNAVAILABLE');
  await rejectsWith(call('ModelInfer', inferRequest(['hi'])), grpc.status.UNAVAILABLE);
  await call('RepositoryModelLoad', { model_name: MODEL });
  assert.equal((await call('ModelReady', { name: MODEL })).ready, true);
  const prompt = 'hello world';
  assert.deepEqual(textOf(await call('ModelInfer', inferRequest([prompt]))), [kilnRun(prompt).text]);
});
