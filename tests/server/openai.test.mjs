// kiln's OpenAI endpoints (/v1/models, /v1/completions, /v1/chat/completions, streamed and not)
// through the official `openai` npm package, a client nobody here wrote.
//
// Environment (set by tests/server/run.sh, which started the server):
//   KILN_HTTP_URL   http://host:port of the server (tests are skipped without it)
//   KILN_BIN        the kiln binary: expected texts come from `kiln run --plan ... --json`, never
//                   from this server
//   KILN_REPO       the model repository the server serves (plans at M/1/model.plan)
//   KILN_MODEL      the completion model, decoder-only with a prompt template (default "bloom")
//   KILN_CHAT_MODEL a model without a prompt template (default "t5")
//   KILN_API_KEY    sent as the bearer key when set
//
// Run: cd tests/server && npm ci && KILN_HTTP_URL=... KILN_BIN=... KILN_REPO=... node --test openai.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';

const URL = process.env.KILN_HTTP_URL;
const BIN = process.env.KILN_BIN;
const REPO = process.env.KILN_REPO;
const MODEL = process.env.KILN_MODEL ?? 'bloom';
const PLAIN_MODEL = process.env.KILN_CHAT_MODEL ?? 't5';
const skip = URL ? false : 'KILN_HTTP_URL is not set (no server to test)';

const client = URL
  ? new OpenAI({
      baseURL: `${URL}/v1`,
      apiKey: process.env.KILN_API_KEY ?? 'unused',
      maxRetries: 0, // a retried request would hide a wrong status
      timeout: 60_000,
    })
  : null;

function planOf(model) {
  assert.ok(REPO, 'KILN_REPO must name the model repository');
  return path.join(REPO, model, '1', 'model.plan');
}

// What `kiln run` generates for `prompt` with the model's plan: {input_ids, output_ids, text}.
const expectedCache = new Map();
function kilnRun(model, prompt, maxTokens, minTokens = 0) {
  const key = JSON.stringify([model, prompt, maxTokens, minTokens]);
  if (!expectedCache.has(key)) {
    assert.ok(BIN, 'KILN_BIN must name the kiln binary');
    const args = ['run', '-q', '--plan', planOf(model), '--prompt', prompt];
    args.push('--max-new-tokens', String(maxTokens), '--json');
    if (minTokens > 0) args.push('--min-new-tokens', String(minTokens));
    const out = execFileSync(BIN, args, { encoding: 'utf8' });
    const result = JSON.parse(out.trim().split('\n').pop());
    assert.equal(typeof result.text, 'string', out);
    expectedCache.set(key, result);
  }
  return expectedCache.get(key);
}

// kiln run stops at max tokens ("length") or before (EOS: "stop").
function finishOf(expected, maxTokens) {
  return expected.output_ids.length >= maxTokens ? 'length' : 'stop';
}

// The models a server of this repository must list: directories whose config (if any) is for
// kiln and whose version 1 plan `kiln inspect` can read. Others (a corrupt plan, another
// platform) fail to load and are not listed.
function loadableModels() {
  const names = [];
  for (const name of fs.readdirSync(REPO).sort()) {
    const dir = path.join(REPO, name);
    if (!fs.statSync(dir).isDirectory()) continue;
    const config = path.join(dir, 'config.pbtxt');
    if (fs.existsSync(config)) {
      const platform = /platform:\s*"([^"]*)"/.exec(fs.readFileSync(config, 'utf8'));
      if (platform && platform[1] !== 'kiln_plan') continue;
    }
    const plan = planOf(name);
    if (!fs.existsSync(plan)) continue;
    try {
      execFileSync(BIN, ['inspect', '-q', '--plan', plan], { stdio: 'ignore' });
    } catch {
      continue;
    }
    names.push(name);
  }
  return names;
}

async function rejectsWith(promise, status, needle) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof OpenAI.APIError, `not an APIError: ${err}`);
    assert.equal(err.status, status, `HTTP ${err.status} (${err.message}), expected ${status}`);
    assert.ok(err.error?.message, `no error.message in ${JSON.stringify(err.error)}`);
    if (needle) assert.match(err.message, new RegExp(needle), err.message);
    return true;
  });
}

const ADD = 'add: 456 + 95';
const REVERSE = 'reverse: suvogi';

test('models.list lists the loadable models of the repository, retrieve finds one', { skip }, async () => {
  const want = loadableModels();
  assert.ok(want.includes(MODEL) && want.includes(PLAIN_MODEL), `repository models: ${want}`);
  const ids = [];
  for await (const m of client.models.list()) {
    assert.equal(m.object, 'model');
    assert.equal(typeof m.owned_by, 'string');
    ids.push(m.id);
  }
  assert.deepEqual(ids.sort(), want);
  const m = await client.models.retrieve(MODEL);
  assert.equal(m.id, MODEL);
  await rejectsWith(client.models.retrieve('no-such-model'), 404, 'no-such-model');
});

test('completions.create at temperature 0 gives kiln run\'s text and token counts', { skip }, async () => {
  for (const [prompt, maxTokens] of [
    [ADD, 8],
    ['reverse: suvogi', 12],
    [ADD, 2],
  ]) {
    const want = kilnRun(MODEL, prompt, maxTokens);
    const r = await client.completions.create({
      model: MODEL,
      prompt,
      max_tokens: maxTokens,
      temperature: 0,
    });
    assert.equal(r.object, 'text_completion');
    assert.equal(r.model, MODEL);
    assert.match(r.id, /^cmpl-/);
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].index, 0);
    assert.equal(r.choices[0].text, want.text, `prompt ${JSON.stringify(prompt)}`);
    assert.equal(r.choices[0].finish_reason, finishOf(want, maxTokens));
    assert.equal(r.usage.prompt_tokens, want.input_ids.length);
    assert.equal(r.usage.completion_tokens, want.output_ids.length);
    assert.equal(r.usage.total_tokens, want.input_ids.length + want.output_ids.length);
  }
});

test('completions.create with a list of prompts and n: one choice each, in order', { skip }, async () => {
  const prompts = [ADD, 'add: 12 + 30', 'reverse: abc'];
  const r = await client.completions.create({ model: MODEL, prompt: prompts, max_tokens: 8, temperature: 0 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.deepEqual(r.choices.map((c) => c.text), prompts.map((p) => kilnRun(MODEL, p, 8).text));
  const two = await client.completions.create({ model: MODEL, prompt: ADD, max_tokens: 8, temperature: 0, n: 2 });
  assert.deepEqual(two.choices.map((c) => c.text), [kilnRun(MODEL, ADD, 8).text, kilnRun(MODEL, ADD, 8).text]);
});

test('completions.create with stop: the text ends before the stop string', { skip }, async () => {
  const full = kilnRun(MODEL, ADD, 16, 16).text;
  const stop = full.slice(2, 4);
  assert.ok(stop.length === 2, `kiln run's text is too short: ${JSON.stringify(full)}`);
  const r = await client.completions.create({
    model: MODEL,
    prompt: ADD,
    max_tokens: 16,
    min_tokens: 16, // kiln's extension (vLLM's too): the SDK passes unknown fields through
    temperature: 0,
    stop: [stop],
  });
  assert.equal(r.choices[0].text, full.slice(0, full.indexOf(stop)));
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('chat.completions.create: one user message goes through the model\'s prompt template', { skip }, async () => {
  // bloom's plan has the template "{prompt} =": a lone user message is its {prompt}, as `kiln
  // run --prompt` does.
  const want = kilnRun(MODEL, ADD, 8);
  const r = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: 'user', content: ADD }],
    max_tokens: 8,
    temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, want.text);
  assert.equal(r.choices[0].finish_reason, finishOf(want, 8));
  assert.equal(r.usage.prompt_tokens, want.input_ids.length);
  assert.equal(r.usage.completion_tokens, want.output_ids.length);
});

test('chat.completions.create: several messages are "role: text" lines in the template', { skip }, async () => {
  const messages = [
    { role: 'system', content: 'You add numbers.' },
    { role: 'user', content: [{ type: 'text', text: 'add: 4' }, { type: 'text', text: ' + 5' }] },
  ];
  const want = kilnRun(MODEL, 'system: You add numbers.\nuser: add: 4 + 5', 8);
  const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0 });
  assert.equal(r.choices[0].message.content, want.text);
  assert.equal(r.usage.prompt_tokens, want.input_ids.length);
});

test('chat.completions.create without a template answers the last user message', { skip }, async () => {
  const want = kilnRun(PLAIN_MODEL, REVERSE, 12);
  const r = await client.chat.completions.create({
    model: PLAIN_MODEL,
    messages: [
      { role: 'system', content: 'You reverse words.' },
      { role: 'user', content: 'reverse: abc' },
      { role: 'assistant', content: 'cba' },
      { role: 'user', content: REVERSE },
    ],
    max_tokens: 12,
    temperature: 0,
  });
  assert.equal(r.model, PLAIN_MODEL);
  assert.equal(r.choices[0].message.content, want.text);
  assert.equal(r.choices[0].finish_reason, finishOf(want, 12));
  await rejectsWith(
    client.chat.completions.create({ model: PLAIN_MODEL, messages: [{ role: 'system', content: 'hi' }] }),
    400,
    'user message',
  );
});

test('streamed completion: several chunks that concatenate to the unstreamed text', { skip }, async () => {
  const maxTokens = 24;
  const want = kilnRun(MODEL, ADD, maxTokens, maxTokens);
  const request = { model: MODEL, prompt: ADD, max_tokens: maxTokens, min_tokens: maxTokens, temperature: 0 };
  const whole = await client.completions.create(request);
  assert.equal(whole.choices[0].text, want.text);
  const stream = await client.completions.create({
    ...request,
    stream: true,
    stream_options: { include_usage: true },
  });
  const pieces = [];
  const finishes = [];
  let usage = null;
  const ids = new Set();
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'text_completion');
    ids.add(chunk.id);
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      pieces.push(c.text);
      if (c.finish_reason) finishes.push(c.finish_reason);
    }
  }
  assert.ok(pieces.filter((p) => p.length > 0).length >= 3, `only ${pieces.length} chunks: ${JSON.stringify(pieces)}`);
  assert.equal(pieces.join(''), whole.choices[0].text);
  assert.deepEqual(finishes, ['length']);
  assert.equal(ids.size, 1, 'every chunk has the same id');
  assert.deepEqual(usage, whole.usage);
});

test('streamed completion that stops at EOS ends with finish_reason "stop"', { skip }, async () => {
  const want = kilnRun(MODEL, ADD, 32);
  assert.ok(want.output_ids.length < 32, 'kiln run did not stop before 32 tokens');
  const stream = await client.completions.create({ model: MODEL, prompt: ADD, max_tokens: 32, temperature: 0, stream: true });
  let text = '';
  let last = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text += c.text;
      last = c.finish_reason;
    }
  }
  assert.equal(text, want.text);
  assert.equal(last, 'stop');
});

test('streamed chat: the first delta has the role, the deltas concatenate to the text', { skip }, async () => {
  const want = kilnRun(PLAIN_MODEL, REVERSE, 12);
  const stream = await client.chat.completions.create({
    model: PLAIN_MODEL,
    messages: [{ role: 'user', content: REVERSE }],
    max_tokens: 12,
    temperature: 0,
    stream: true,
  });
  const deltas = [];
  let finish = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    for (const c of chunk.choices) {
      deltas.push(c.delta);
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(deltas[0].role, 'assistant');
  assert.ok(deltas.slice(1).every((d) => d.role === undefined), JSON.stringify(deltas));
  assert.equal(deltas.map((d) => d.content ?? '').join(''), want.text);
  assert.equal(finish, finishOf(want, 12));
});

// Streamed chunks of several choices, joined per choice index: {index: {text, finish, roles}}.
async function joinChoices(stream, chat) {
  const by = new Map();
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      const e = by.get(c.index) ?? { text: '', finish: null, roles: [] };
      e.text += chat ? (c.delta.content ?? '') : c.text;
      if (chat && c.delta.role) e.roles.push(c.delta.role);
      if (c.finish_reason) e.finish = c.finish_reason;
      by.set(c.index, e);
    }
  }
  return { by, usage };
}

test('streamed n and prompt lists: each choice\'s chunks make the unstreamed choice', { skip }, async () => {
  // Sampled, with a seed: choice i of a prompt samples from its own seed, streamed or not.
  const request = { model: MODEL, prompt: [ADD, 'add: 12 + 30'], n: 2, max_tokens: 10, temperature: 0.9, seed: 7 };
  const whole = await client.completions.create(request);
  assert.equal(whole.choices.length, 4);
  const { by, usage } = await joinChoices(
    await client.completions.create({ ...request, stream: true, stream_options: { include_usage: true } }),
    false,
  );
  assert.deepEqual([...by.keys()].sort(), [0, 1, 2, 3]);
  for (const c of whole.choices) {
    assert.equal(by.get(c.index).text, c.text, `choice ${c.index}`);
    assert.equal(by.get(c.index).finish, c.finish_reason, `choice ${c.index}`);
  }
  assert.deepEqual(usage, whole.usage);
  const chat = { model: PLAIN_MODEL, messages: [{ role: 'user', content: REVERSE }], n: 3, max_tokens: 8, temperature: 0 };
  const wholeChat = await client.chat.completions.create(chat);
  const streamed = await joinChoices(await client.chat.completions.create({ ...chat, stream: true }), true);
  assert.equal(streamed.by.size, 3);
  for (const c of wholeChat.choices) {
    const e = streamed.by.get(c.index);
    assert.equal(e.text, c.message.content, `chat choice ${c.index}`);
    assert.deepEqual(e.roles, ['assistant'], 'one role delta per choice');
  }
});

test('errors: APIError with OpenAI\'s status and message', { skip }, async () => {
  const unknown = client.completions.create({ model: 'no-such-model', prompt: 'a', max_tokens: 4 });
  await assert.rejects(unknown, (err) => {
    assert.ok(err instanceof OpenAI.NotFoundError, `${err}`);
    assert.equal(err.status, 404);
    assert.match(err.error.message, /no-such-model/);
    assert.equal(err.code, 'model_not_found');
    return true;
  });
  await rejectsWith(
    client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'a' }], stream: true }),
    404,
    'no-such-model',
  );
  for (const maxTokens of [0, -3, 10_000_000, 2.5, '8']) {
    await rejectsWith(
      client.completions.create({ model: MODEL, prompt: ADD, max_tokens: maxTokens }),
      400,
      'max_tokens',
    );
  }
  await rejectsWith(client.completions.create({ model: MODEL, prompt: ADD, max_tokens: 0, stream: true }), 400, 'max_tokens');
  await rejectsWith(client.completions.create({ model: MODEL, prompt: ADD, temperature: -1 }), 400, 'temperature');
  await rejectsWith(client.completions.create({ model: MODEL, prompt: ADD, logprobs: 2 }), 400, 'logprobs');
  await rejectsWith(client.completions.create({ model: MODEL, prompt: ADD, n: 17, stream: true }), 400, 'n must be');
  await rejectsWith(client.completions.create({ model: MODEL, prompt: '' }), 400, 'empty');
  await rejectsWith(client.chat.completions.create({ model: MODEL, messages: [] }), 400, 'messages');
  await rejectsWith(
    client.chat.completions.create({ model: MODEL, messages: [{ role: 'tool', content: 'x' }] }),
    400,
    'role',
  );
  // After the errors the server still answers.
  const r = await client.completions.create({ model: MODEL, prompt: ADD, max_tokens: 8, temperature: 0 });
  assert.equal(r.choices[0].text, kilnRun(MODEL, ADD, 8).text);
});
