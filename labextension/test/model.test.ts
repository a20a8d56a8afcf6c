import { ServerConnection } from '@jupyterlab/services';
import { afterEach, describe, expect, it, vi } from 'vitest';

import { BalanceModel, secondsToMs } from '../src/model';
import { exampleMe } from './fixtures';

type Answer = { status: number; body: unknown } | Error;

function settingsAnswering(answers: Answer[]): {
  settings: ServerConnection.ISettings;
  urls: string[];
} {
  const urls: string[] = [];
  const fetchMock = vi.fn(async (input: RequestInfo | URL) => {
    urls.push(typeof input === 'string' ? input : (input as Request).url);
    const next = answers.length > 1 ? answers.shift()! : answers[0];
    if (next instanceof Error) {
      throw next;
    }
    return new Response(JSON.stringify(next.body), {
      status: next.status,
      headers: { 'Content-Type': 'application/json' }
    });
  });
  const settings = ServerConnection.makeSettings({
    baseUrl: 'http://lab.example/user/alice/',
    wsUrl: 'ws://lab.example/user/alice/',
    token: 'secret',
    fetch: fetchMock as unknown as typeof fetch,
    Request,
    Headers
  });
  return { settings, urls };
}

describe('BalanceModel', () => {
  let model: BalanceModel | null = null;
  afterEach(() => {
    model?.dispose();
    model = null;
  });

  it('fetches {base_url}gpupool/me and keeps the answer', async () => {
    const { settings, urls } = settingsAnswering([{ status: 200, body: exampleMe() }]);
    model = new BalanceModel({ serverSettings: settings, auto: false });
    let changes = 0;
    model.changed.connect(() => changes++);
    await model.poll.start();
    await vi.waitFor(() => expect(model!.data).not.toBeNull());
    // (makeRequest adds a cache-busting query)
    expect(urls[0]).toMatch(/^http:\/\/lab\.example\/user\/alice\/gpupool\/me(\?\d+)?$/);
    expect(model.data!.balance).toBe('46.000');
    expect(model.error).toBeNull();
    expect(changes).toBeGreaterThan(0);
  });

  it('turns an error answer into a reason and drops stale data', async () => {
    const { settings } = settingsAnswering([
      { status: 200, body: exampleMe() },
      { status: 503, body: { error: 'balance unavailable', reason: 'gpupool service unreachable' } }
    ]);
    model = new BalanceModel({ serverSettings: settings, auto: false });
    await model.poll.start();
    await vi.waitFor(() => expect(model!.data).not.toBeNull());
    await model.refresh();
    await vi.waitFor(() => expect(model!.error).toBe('gpupool service unreachable'));
    expect(model.data).toBeNull();
  });

  it('reports a network failure or a non-JSON answer', async () => {
    const { settings } = settingsAnswering([new TypeError('Failed to fetch')]);
    model = new BalanceModel({ serverSettings: settings, auto: false });
    await model.poll.start();
    await vi.waitFor(() => expect(model!.error).toMatch(/Failed to fetch/));

    model.dispose();
    const other = settingsAnswering([{ status: 502, body: 'oops' }]);
    model = new BalanceModel({ serverSettings: other.settings, auto: false });
    await model.poll.start();
    await vi.waitFor(() => expect(model!.error).toBe('HTTP 502'));
  });

  it('polls with backoff, stands by when hidden, and takes a new interval', () => {
    const { settings } = settingsAnswering([{ status: 200, body: exampleMe() }]);
    model = new BalanceModel({ serverSettings: settings, auto: false, intervalSeconds: 30 });
    expect(model.poll.frequency).toMatchObject({ interval: 30000, backoff: true });
    expect(model.poll.standby).toBe('when-hidden');
    model.setInterval(2);
    expect(model.poll.frequency.interval).toBe(2000);
  });

  it('never polls faster than once a second', () => {
    expect(secondsToMs(30)).toBe(30000);
    expect(secondsToMs(0.2)).toBe(1000);
    expect(secondsToMs(0)).toBe(30000);
    expect(secondsToMs(NaN)).toBe(30000);
  });
});
