// kvserve's OpenAI-compatible HTTP front through the official `openai` npm client: each case calls
// the client's own methods and checks what it hands back, so that a field the client needs, a
// wrong status or an error body it cannot read shows up as it would in a user's program.
//
// Run by run.sh, which starts the cluster (stories260K with Qwen2.5's chat template) and sets
// KVSERVE_OPENAI_BASE_URL=http://HOST:PORT/v1. Sampling is greedy (temperature 0) or seeded, so
// every case is deterministic; stories260K writes children's stories, so the text is nonsense and
// only its structure is checked, except where the output constraint makes it valid JSON.

import assert from 'node:assert/strict';
import { before, test } from 'node:test';

import Ajv from 'ajv';
import OpenAI from 'openai';

const baseURL = process.env.KVSERVE_OPENAI_BASE_URL;
if (!baseURL) throw new Error('KVSERVE_OPENAI_BASE_URL is not set (run.sh sets it)');

// No retries: a retried 5xx or dropped connection would hide a server fault.
const client = new OpenAI({
  baseURL, apiKey: 'kvserve-test-dummy-key', maxRetries: 0, timeout: 60_000,
});
const ajv = new Ajv({ allErrors: true, strict: true });
const kCase = { timeout: 60_000 };

const show = (value) => JSON.stringify(value);

// The served model's id, from /v1/models.
let model;

before(async () => {
  const models = [];
  for await (const card of client.models.list()) models.push(card);
  assert.equal(models.length, 1, `one model served, got ${show(models)}`);
  assert.equal(models[0].object, 'model');
  model = models[0].id;
  assert.equal(typeof model, 'string');
});

const kStoryPrompt = 'Once upon a time';
const kChatMessages = [
  { role: 'system', content: 'You are a storyteller.' },
  { role: 'user', content: 'Tell me a story about a cat.' },
];

/** Checks a usage block: positive counts that add up. */
function checkUsage(usage, { completionTokens } = {}) {
  assert.ok(usage, 'usage missing');
  assert.ok(Number.isInteger(usage.prompt_tokens) && usage.prompt_tokens > 0,
            `prompt_tokens: ${usage.prompt_tokens}`);
  assert.ok(Number.isInteger(usage.completion_tokens) && usage.completion_tokens > 0,
            `completion_tokens: ${usage.completion_tokens}`);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
  if (completionTokens !== undefined) assert.equal(usage.completion_tokens, completionTokens);
}

/** Checks that a choice ended normally: a stop (token or string) or max_tokens. */
function checkFinished(choice) {
  const reason = choice.finish_reason;
  assert.ok(reason === 'stop' || reason === 'length', `finish_reason ${reason}`);
}

/** Drains a stream into an array of chunks, checking the envelope every chunk shares. */
async function collect(stream, object) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.ok(chunks.length > 0, 'empty stream');
  for (const chunk of chunks) {
    assert.equal(chunk.object, object);
    assert.equal(chunk.id, chunks[0].id, 'one id across the stream');
    assert.equal(chunk.model, model);
  }
  return chunks;
}

/** The chunk carrying usage: the last one, with no choices (stream_options.include_usage). */
function usageChunk(chunks) {
  const last = chunks.at(-1);
  assert.ok(last.usage, `the last chunk has no usage: ${show(last)}`);
  assert.deepEqual(last.choices, []);
  for (const chunk of chunks.slice(0, -1)) {
    assert.ok(chunk.usage == null, `usage before the last chunk: ${show(chunk)}`);
  }
  return last.usage;
}

/** Awaits a rejection by the client with `errorClass` and `status`; returns the error. */
async function expectApiError(promise, errorClass, status) {
  let caught;
  await assert.rejects(promise, (err) => {
    caught = err;
    return true;
  });
  assert.ok(caught instanceof errorClass,
            `expected ${errorClass.name}, got ${caught?.constructor?.name}: ${caught?.message}`);
  assert.equal(caught.status, status);
  assert.equal(typeof caught.error?.message, 'string', `no error.message in ${show(caught.error)}`);
  return caught;
}

// --- completions and chat ------------------------------------------------------------------------

test('completions.create: text, usage, finish_reason length', kCase, async () => {
  const completion = await client.completions.create({
    model, prompt: kStoryPrompt, max_tokens: 16, temperature: 0,
  });
  assert.equal(completion.object, 'text_completion');
  assert.equal(completion.model, model);
  assert.equal(typeof completion.id, 'string');
  assert.ok(Number.isInteger(completion.created));
  assert.equal(completion.choices.length, 1);
  const [choice] = completion.choices;
  assert.equal(choice.index, 0);
  assert.equal(typeof choice.text, 'string');
  assert.ok(choice.text.length > 0, 'empty text');
  assert.equal(choice.finish_reason, 'length');
  checkUsage(completion.usage, { completionTokens: 16 });
});

test('chat.completions.create: an assistant message and usage', kCase, async () => {
  const completion = await client.chat.completions.create({
    model, messages: kChatMessages, max_tokens: 16, temperature: 0,
  });
  assert.equal(completion.object, 'chat.completion');
  assert.equal(completion.model, model);
  assert.equal(completion.choices.length, 1);
  const [choice] = completion.choices;
  assert.equal(choice.index, 0);
  assert.equal(choice.message.role, 'assistant');
  assert.equal(typeof choice.message.content, 'string');
  checkFinished(choice);
  checkUsage(completion.usage);
  assert.ok(completion.usage.completion_tokens <= 16);
});

test('streamed chat equals the non-streamed one; usage in the last chunk', kCase, async () => {
  const params = { model, messages: kChatMessages, max_tokens: 24, temperature: 0 };
  const whole = await client.chat.completions.create(params);
  const stream = await client.chat.completions.create({
    ...params, stream: true, stream_options: { include_usage: true },
  });
  const chunks = await collect(stream, 'chat.completion.chunk');
  let text = '';
  let role;
  let finishReason = null;
  for (const chunk of chunks.slice(0, -1)) {
    assert.equal(chunk.choices.length, 1, show(chunk));
    const [choice] = chunk.choices;
    assert.equal(choice.index, 0);
    assert.equal(finishReason, null, 'a chunk after the one with finish_reason');
    role ??= choice.delta.role;
    text += choice.delta.content ?? '';
    finishReason = choice.finish_reason ?? null;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finishReason, whole.choices[0].finish_reason);
  const usage = usageChunk(chunks);
  checkUsage(usage);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
});

test('streamed completions equal the non-streamed one', kCase, async () => {
  const params = { model, prompt: kStoryPrompt, max_tokens: 24, temperature: 0 };
  const whole = await client.completions.create(params);
  const stream = await client.completions.create({
    ...params, stream: true, stream_options: { include_usage: true },
  });
  const chunks = await collect(stream, 'text_completion');
  let text = '';
  let finishReason = null;
  for (const chunk of chunks.slice(0, -1)) {
    assert.equal(chunk.choices.length, 1, show(chunk));
    assert.equal(chunk.choices[0].index, 0);
    assert.equal(finishReason, null, 'a chunk after the one with finish_reason');
    text += chunk.choices[0].text;
    finishReason = chunk.choices[0].finish_reason ?? null;
  }
  assert.equal(text, whole.choices[0].text);
  assert.equal(finishReason, 'length');
  const usage = usageChunk(chunks);
  checkUsage(usage, { completionTokens: 24 });
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
});

test('n: 3 seeded samples, indexes 0..2', kCase, async () => {
  const completion = await client.completions.create({
    model, prompt: kStoryPrompt, max_tokens: 12, temperature: 1, seed: 1234, n: 3,
  });
  assert.deepEqual(completion.choices.map((c) => c.index), [0, 1, 2]);
  for (const choice of completion.choices) {
    assert.equal(typeof choice.text, 'string');
    checkFinished(choice);
  }
  // Three samples, not one sample three times.
  assert.ok(new Set(completion.choices.map((c) => c.text)).size > 1,
            `three identical samples: ${show(completion.choices.map((c) => c.text))}`);
  checkUsage(completion.usage);

  const chat = await client.chat.completions.create({
    model, messages: kChatMessages, max_tokens: 12, temperature: 1, seed: 1234, n: 3,
  });
  assert.deepEqual(chat.choices.map((c) => c.index), [0, 1, 2]);
  for (const choice of chat.choices) {
    assert.equal(choice.message.role, 'assistant');
    assert.equal(typeof choice.message.content, 'string');
  }
  checkUsage(chat.usage);
});

// --- logprobs ------------------------------------------------------------------------------------

test('logprobs: completions (logprobs 2) and chat (top_logprobs 2)', kCase, async () => {
  const completion = await client.completions.create({
    model, prompt: kStoryPrompt, max_tokens: 8, temperature: 0, logprobs: 2,
  });
  const lp = completion.choices[0].logprobs;
  assert.ok(lp, 'choices[0].logprobs missing');
  const count = completion.usage.completion_tokens;
  assert.equal(lp.tokens.length, count);
  assert.equal(lp.token_logprobs.length, count);
  assert.equal(lp.top_logprobs.length, count);
  assert.equal(lp.text_offset.length, count);
  for (let i = 0; i < count; ++i) {
    assert.equal(typeof lp.tokens[i], 'string');
    assert.ok(lp.token_logprobs[i] <= 0, `token_logprobs[${i}] = ${lp.token_logprobs[i]}`);
    const top = Object.values(lp.top_logprobs[i]);
    assert.equal(top.length, 2, `top_logprobs[${i}]: ${show(lp.top_logprobs[i])}`);
    for (const v of top) assert.ok(v <= 0, `top_logprobs[${i}] value ${v}`);
    // Greedy: the chosen token is the likeliest.
    assert.ok(Math.abs(Math.max(...top) - lp.token_logprobs[i]) < 1e-5,
              `token ${i} is not the top one: ${lp.token_logprobs[i]} vs ${show(top)}`);
  }

  const chat = await client.chat.completions.create({
    model, messages: kChatMessages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  const content = chat.choices[0].logprobs?.content;
  assert.ok(Array.isArray(content), `choices[0].logprobs: ${show(chat.choices[0].logprobs)}`);
  assert.equal(content.length, chat.usage.completion_tokens);
  for (const [i, entry] of content.entries()) {
    assert.equal(typeof entry.token, 'string');
    assert.ok(entry.logprob <= 0, `content[${i}].logprob = ${entry.logprob}`);
    assert.ok(Array.isArray(entry.bytes), `content[${i}].bytes`);
    assert.equal(entry.top_logprobs.length, 2, `content[${i}].top_logprobs`);
    for (const alt of entry.top_logprobs) {
      assert.equal(typeof alt.token, 'string');
      assert.ok(alt.logprob <= 0, `content[${i}] top logprob ${alt.logprob}`);
    }
  }
});

// OpenAI's contract: the tokens, joined, are the text, and text_offset[i] is where token i starts.
test('logprobs: completions tokens spell the text at their text_offset', kCase, async () => {
  const completion = await client.completions.create({
    model, prompt: kStoryPrompt, max_tokens: 8, temperature: 0, logprobs: 1,
  });
  const { text, logprobs: lp } = completion.choices[0];
  assert.equal(lp.tokens.join(''), text, `tokens ${show(lp.tokens)} vs text ${show(text)}`);
  lp.tokens.forEach((token, i) => {
    const offset = lp.text_offset[i];
    assert.equal(text.slice(offset, offset + token.length), token,
                 `text_offset[${i}] = ${offset} does not point at ${show(token)} in ${show(text)}`);
  });
});

// The chat form: the tokens joined are the content, and their bytes its UTF-8.
test('logprobs: chat tokens and bytes spell the content', kCase, async () => {
  const chat = await client.chat.completions.create({
    model, messages: kChatMessages, max_tokens: 8, temperature: 0, logprobs: true,
  });
  const text = chat.choices[0].message.content;
  const { content } = chat.choices[0].logprobs;
  const tokens = content.map((e) => e.token);
  assert.equal(tokens.join(''), text, `tokens ${show(tokens)} vs content ${show(text)}`);
  assert.deepEqual(content.flatMap((e) => e.bytes), [...Buffer.from(text, 'utf8')]);
});

// --- stop strings --------------------------------------------------------------------------------

test('stop: output cut before the stop string, finish_reason stop', kCase, async () => {
  const params = { model, prompt: kStoryPrompt, max_tokens: 32, temperature: 0 };
  const whole = (await client.completions.create(params)).choices[0].text;
  // A piece from the middle of the greedy output; the output ends before its first occurrence.
  const middle = Math.floor(whole.length / 2);
  const stop = whole.slice(middle, middle + 4);
  assert.equal(stop.length, 4, `output too short: ${show(whole)}`);
  const expected = whole.slice(0, whole.indexOf(stop));

  const cut = await client.completions.create({ ...params, stop });
  assert.equal(cut.choices[0].text, expected, `stop ${show(stop)} in ${show(whole)}`);
  assert.equal(cut.choices[0].finish_reason, 'stop');

  // A list of stop strings: the one that occurs stops.
  const listCut = await client.completions.create({ ...params, stop: ['never appears', stop] });
  assert.equal(listCut.choices[0].text, expected);
  assert.equal(listCut.choices[0].finish_reason, 'stop');
});

// --- structured outputs --------------------------------------------------------------------------

test('response_format json_object: content parses to an object', kCase, async () => {
  const completion = await client.chat.completions.create({
    model,
    messages: [
      { role: 'system', content: 'Reply in JSON.' },
      { role: 'user', content: 'Describe a cat as a JSON object.' },
    ],
    response_format: { type: 'json_object' },
    max_tokens: 300,
    temperature: 0.7,
    seed: 4,
  });
  const [choice] = completion.choices;
  assert.equal(choice.finish_reason, 'stop',
               `finish_reason ${choice.finish_reason}: ${choice.message.content}`);
  const value = JSON.parse(choice.message.content);
  assert.ok(value !== null && typeof value === 'object' && !Array.isArray(value),
            `not an object: ${choice.message.content}`);
});

const kCatSchema = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 20 },
    age: { type: 'integer', minimum: 1, maximum: 20 },
    mood: { type: 'string', enum: ['happy', 'sad', 'sleepy'] },
    toys: { type: 'array', items: { type: 'string', maxLength: 12 }, minItems: 1, maxItems: 3 },
    home: {
      type: 'object',
      properties: {
        city: { type: 'string', maxLength: 16 },
        floor: { type: 'integer', minimum: 0, maximum: 9 },
      },
      required: ['city', 'floor'],
      additionalProperties: false,
    },
  },
  required: ['name', 'age', 'mood', 'toys', 'home'],
  additionalProperties: false,
};

test('response_format json_schema: content validates against the schema', kCase, async () => {
  const completion = await client.chat.completions.create({
    model,
    messages: [{ role: 'user', content: 'Describe a cat.' }],
    response_format: {
      type: 'json_schema', json_schema: { name: 'cat', strict: true, schema: kCatSchema },
    },
    max_tokens: 300,
    temperature: 0.7,
    seed: 3,
  });
  const [choice] = completion.choices;
  assert.equal(choice.finish_reason, 'stop',
               `finish_reason ${choice.finish_reason}: ${choice.message.content}`);
  const value = JSON.parse(choice.message.content);
  const validate = ajv.compile(kCatSchema);
  assert.ok(validate(value), `${choice.message.content}: ${ajv.errorsText(validate.errors)}`);
});

// --- errors --------------------------------------------------------------------------------------

test('errors: bad temperature, unknown model, missing messages', kCase, async () => {
  const badTemperature = await expectApiError(
    client.chat.completions.create({
      model, messages: kChatMessages, max_tokens: 4, temperature: -1,
    }),
    OpenAI.BadRequestError, 400);
  assert.equal(badTemperature.param, 'temperature');
  assert.equal(badTemperature.type, 'invalid_request_error');

  const unknownModel = await expectApiError(
    client.chat.completions.create({
      model: 'no-such-model', messages: kChatMessages, max_tokens: 4,
    }),
    OpenAI.NotFoundError, 404);
  assert.equal(unknownModel.code, 'model_not_found');
  assert.equal(unknownModel.param, 'model');

  const noMessages = await expectApiError(
    client.chat.completions.create({ model, max_tokens: 4 }), OpenAI.BadRequestError, 400);
  assert.equal(noMessages.param, 'messages');

  // The completions endpoint maps errors the same way.
  const badCompletion = await expectApiError(
    client.completions.create({ model, prompt: kStoryPrompt, max_tokens: 4, temperature: -1 }),
    OpenAI.BadRequestError, 400);
  assert.equal(badCompletion.param, 'temperature');
});

// --- tool calls ----------------------------------------------------------------------------------
// Hermes-style tool calls (Qwen2.5's template writes the tools into the system prompt and the
// calls as <tool_call>{"name": ..., "arguments": ...}</tool_call>); with tool_choice "required"
// or a named function the server must constrain the output to calls of the given tools.

const kTools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The current weather in a city',
      parameters: {
        type: 'object',
        properties: {
          city: { type: 'string', maxLength: 24 },
          unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
        },
        required: ['city'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'get_time',
      description: 'The current time in a time zone',
      parameters: {
        type: 'object',
        properties: { timezone: { type: 'string', maxLength: 24 } },
        additionalProperties: false,
      },
    },
  },
];
const kToolValidators = new Map(
  kTools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
const kToolMessages = [
  { role: 'user', content: 'What is the weather in Paris, and the time in Tokyo?' },
];
// Greedy, stories260K never chooses to stop between calls: with parallel calls allowed it writes
// call after call until max_tokens. A frequency penalty on the repeated call markup lets it end
// (after three calls, both tools among them), well inside max_tokens.
const kToolParams = { tools: kTools, max_tokens: 600, temperature: 0, frequency_penalty: 2 };

/** Checks one tool call: an id, a known function, arguments valid for its parameters. */
function checkToolCall(call, where) {
  assert.equal(typeof call.id, 'string', `${where}.id`);
  assert.ok(call.id.startsWith('call_'), `${where}.id ${call.id}`);
  assert.equal(call.type, 'function', `${where}.type`);
  const validate = kToolValidators.get(call.function?.name);
  assert.ok(validate, `${where}.function.name ${call.function?.name} is not one of the tools`);
  assert.equal(typeof call.function.arguments, 'string', `${where}.function.arguments: a string`);
  const args = JSON.parse(call.function.arguments);
  assert.ok(validate(args), `${where} ${call.function.name}(${call.function.arguments}): ` +
            ajv.errorsText(validate.errors));
}

/** Checks a response that must hold tool calls; returns them. */
function expectToolCalls(completion) {
  const [choice] = completion.choices;
  assert.equal(choice.finish_reason, 'tool_calls', `finish_reason ${choice.finish_reason}: ` +
               show(choice.message));
  assert.equal(choice.message.role, 'assistant');
  const calls = choice.message.tool_calls;
  assert.ok(Array.isArray(calls) && calls.length > 0, `no tool_calls: ${show(choice.message)}`);
  calls.forEach((call, i) => checkToolCall(call, `tool_calls[${i}]`));
  assert.equal(new Set(calls.map((c) => c.id)).size, calls.length, 'tool call ids repeat');
  return calls;
}

test('tools: tool_choice required gives valid tool calls', kCase, async () => {
  const completion = await client.chat.completions.create({
    model, messages: kToolMessages, ...kToolParams, tool_choice: 'required',
  });
  expectToolCalls(completion);
});

test('tools: tool_choice naming a function calls that function once', kCase, async () => {
  const completion = await client.chat.completions.create({
    model, messages: kToolMessages, ...kToolParams,
    tool_choice: { type: 'function', function: { name: 'get_time' } },
  });
  const calls = expectToolCalls(completion);
  assert.equal(calls.length, 1, show(calls));
  assert.equal(calls[0].function.name, 'get_time');
});

test('tools: parallel_tool_calls false gives one call', kCase, async () => {
  const completion = await client.chat.completions.create({
    model, messages: kToolMessages, ...kToolParams,
    tool_choice: 'required', parallel_tool_calls: false,
  });
  const calls = expectToolCalls(completion);
  assert.equal(calls.length, 1, show(calls));
});

test('tools: streamed tool calls accumulate to the non-streamed ones', kCase, async () => {
  const params = { model, messages: kToolMessages, ...kToolParams, tool_choice: 'required' };
  const whole = expectToolCalls(await client.chat.completions.create(params));
  const stream = await client.chat.completions.create({
    ...params, stream: true, stream_options: { include_usage: true },
  });
  const chunks = await collect(stream, 'chat.completion.chunk');
  const calls = [];  // by index
  let finishReason = null;
  for (const chunk of chunks.slice(0, -1)) {
    for (const choice of chunk.choices) {
      assert.equal(choice.index, 0);
      for (const delta of choice.delta.tool_calls ?? []) {
        assert.ok(Number.isInteger(delta.index), `a tool call delta without index: ${show(delta)}`);
        let call = calls[delta.index];
        if (call === undefined) {
          // The first delta of a call names it.
          assert.equal(delta.index, calls.length, `tool call index ${delta.index} skips one`);
          assert.equal(typeof delta.id, 'string', `first delta of a call: ${show(delta)}`);
          assert.equal(typeof delta.function?.name, 'string',
                       `first delta of a call: ${show(delta)}`);
          call = {
            id: delta.id,
            type: delta.type ?? 'function',
            function: { name: delta.function.name, arguments: '' },
          };
          calls[delta.index] = call;
        } else {
          if (delta.id !== undefined) assert.equal(delta.id, call.id, 'a call changed its id');
          if (delta.function?.name !== undefined) {
            assert.equal(delta.function.name, call.function.name, 'a call changed its name');
          }
        }
        call.function.arguments += delta.function?.arguments ?? '';
      }
      if (choice.finish_reason) finishReason = choice.finish_reason;
    }
  }
  assert.equal(finishReason, 'tool_calls');
  assert.ok(calls.length > 0, 'no tool call deltas in the stream');
  calls.forEach((call, i) => checkToolCall(call, `streamed call ${i}`));
  // Greedy both times: the same calls (ids aside).
  const summary = (list) => list.map((c) => [c.function.name, JSON.parse(c.function.arguments)]);
  assert.deepEqual(summary(calls), summary(whole));
  checkUsage(usageChunk(chunks));
});

test('tools: a tool result round trip answers with text', kCase, async () => {
  const first = await client.chat.completions.create({
    model, messages: kToolMessages, ...kToolParams,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  const calls = expectToolCalls(first);
  const messages = [
    ...kToolMessages,
    { role: 'assistant', content: null, tool_calls: calls },
    ...calls.map((call) => ({ role: 'tool', tool_call_id: call.id, content: '22 C' })),
  ];
  const answer = await client.chat.completions.create({
    model, messages, ...kToolParams, max_tokens: 32, tool_choice: 'none',
  });
  const [choice] = answer.choices;
  assert.equal(choice.message.role, 'assistant');
  assert.equal(typeof choice.message.content, 'string');
  assert.ok(!choice.message.tool_calls?.length,
            `tool_calls despite tool_choice none: ${show(choice.message)}`);
  checkFinished(choice);
});

test('tools: tool_choice naming an unknown function is a 400', kCase, async () => {
  const error = await expectApiError(
    client.chat.completions.create({
      model, messages: kToolMessages, ...kToolParams,
      tool_choice: { type: 'function', function: { name: 'get_stock_price' } },
    }),
    OpenAI.BadRequestError, 400);
  // Refused for the choice, not for the tools.
  assert.match(String(error.param), /^tool_choice/, `param ${error.param}: ${error.message}`);
});
