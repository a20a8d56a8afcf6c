/**
 * The balance model: polls `{base_url}gpupool/me` with a Lumino `Poll`
 * (backs off on errors, stands by while the browser tab is hidden, unless
 * `keepAwake` says documents with unsaved changes need to hear of a countdown).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import type { IMe, IUnavailable } from './types';

/** Default refresh interval, seconds (also the schema default). */
export const DEFAULT_INTERVAL_S = 30;
/** Longest wait between tries while the balance keeps failing. */
export const MAX_BACKOFF_MS = 5 * 60 * 1000;

export class BalanceModel implements IDisposable {
  constructor(options: BalanceModel.IOptions = {}) {
    this._serverSettings = options.serverSettings ?? ServerConnection.makeSettings();
    this._poll = new Poll<void, Error>({
      auto: options.auto ?? true,
      factory: () => this._fetch(),
      frequency: {
        interval: secondsToMs(options.intervalSeconds ?? DEFAULT_INTERVAL_S),
        backoff: true,
        max: MAX_BACKOFF_MS
      },
      name: '@gpupool/hub-balance:me',
      // hidden tab: no polls, unless keepAwake says a countdown must still reach it (save.ts)
      standby: options.keepAwake
        ? () => typeof document !== 'undefined' && document.hidden && !options.keepAwake!()
        : 'when-hidden'
    });
  }

  /** Emitted after every poll, successful or not. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The last good answer; null while unavailable. */
  get data(): IMe | null {
    return this._data;
  }

  /** Why the balance is unavailable; null when `data` is current. */
  get error(): string | null {
    return this._error;
  }

  /** When the model last changed (ms since epoch); 0 before the first poll. */
  get updatedAt(): number {
    return this._updatedAt;
  }

  get serverSettings(): ServerConnection.ISettings {
    return this._serverSettings;
  }

  get poll(): Poll<void, Error> {
    return this._poll;
  }

  get isDisposed(): boolean {
    return this._poll.isDisposed;
  }

  /** Change the refresh interval (seconds) and poll right away. */
  setInterval(seconds: number): void {
    const interval = secondsToMs(seconds);
    if (interval === this._poll.frequency.interval) {
      return;
    }
    this._poll.frequency = { ...this._poll.frequency, interval };
    void this._poll.refresh();
  }

  /** Poll now (e.g. when the panel opens). */
  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _fetch(): Promise<void> {
    const url = URLExt.join(this._serverSettings.baseUrl, 'gpupool', 'me');
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, {}, this._serverSettings);
    } catch (err) {
      this._fail(`server unreachable: ${(err as Error).message ?? err}`);
      throw err;
    }
    let body: unknown = null;
    try {
      body = await response.json();
    } catch {
      body = null;
    }
    if (!response.ok || !body || typeof body !== 'object' || !('balance' in body)) {
      const reason =
        (body as IUnavailable | null)?.reason ??
        (body as IUnavailable | null)?.error ??
        `HTTP ${response.status}`;
      this._fail(reason);
      throw new Error(reason);
    }
    this._data = body as IMe;
    this._error = null;
    this._updatedAt = Date.now();
    this._changed.emit();
  }

  private _fail(reason: string): void {
    this._data = null;
    this._error = reason;
    this._updatedAt = Date.now();
    this._changed.emit();
  }

  private _changed = new Signal<this, void>(this);
  private _data: IMe | null = null;
  private _error: string | null = null;
  private _updatedAt = 0;
  private _poll: Poll<void, Error>;
  private _serverSettings: ServerConnection.ISettings;
}

export namespace BalanceModel {
  export interface IOptions {
    serverSettings?: ServerConnection.ISettings;
    /** Refresh interval in seconds; default 30. */
    intervalSeconds?: number;
    /** Start polling at once; default true. */
    auto?: boolean;
    /** Poll on while the tab is hidden when this says so (unsaved documents); default never. */
    keepAwake?: () => boolean;
  }
}

/** Seconds → ms, never below 1 s (a broken setting must not hammer the hub). */
export function secondsToMs(seconds: number): number {
  const s = Number.isFinite(seconds) && seconds > 0 ? seconds : DEFAULT_INTERVAL_S;
  return Math.round(Math.max(1, s) * 1000);
}
