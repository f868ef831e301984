// The Vercel AI SDK's four common calls against `ferrum serve`, through
// its default OpenAI provider (`createOpenAI({ baseURL })(id)`, which
// speaks the Responses API). Prints one JSON object of what came back;
// test_aisdk.py checks it. Usage: node calls.mjs BASE_URL MODEL
import { createOpenAI } from '@ai-sdk/openai';
import { generateObject, generateText, streamText, tool } from 'ai';
import { z } from 'zod';

const [baseURL, id] = process.argv.slice(2);
const model = createOpenAI({ baseURL, apiKey: 'none' })(id);
const ask = { model, prompt: 'Name three colors.', temperature: 0, maxOutputTokens: 20 };

const text = await generateText(ask);
let streamed = '';
for await (const part of streamText(ask).textStream) streamed += part;
const object = await generateObject({
  model,
  schema: z.object({ color: z.string() }),
  prompt: 'Pick a color.',
  temperature: 0,
});
const weather = await generateText({
  model,
  prompt: 'What is the weather in Paris?',
  temperature: 0,
  toolChoice: 'required',
  tools: {
    get_weather: tool({
      description: 'Current weather in a city',
      inputSchema: z.object({ city: z.string() }),
    }),
  },
});
console.log(JSON.stringify({
  text: text.text,
  finishReason: text.finishReason,
  usage: { input: text.usage.inputTokens, output: text.usage.outputTokens },
  streamed,
  object: object.object,
  toolCalls: weather.toolCalls.map((c) => ({ name: c.toolName, input: c.input })),
}));
