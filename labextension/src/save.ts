/**
 * Work saved before GPUs are taken: when a countdown reaches the widget (a
 * reclaim of borrowed GPUs, an idle stop, a kernel cull, the floor stop within
 * 10 minutes), every open document
 * with unsaved changes is saved at once, and again 30 s before the stop, so
 * that a server stopped while its owner is away loses no edits. Turned off by
 * the `saveBeforeStop` setting. The texts here are quoted in
 * docs/user-guide.md.
 *
 * The rule (which deadline, when to save) is plain code with the saving and
 * the clock passed in, so vitest checks it without JupyterLab
 * (test/save.test.ts); index.ts passes the function that saves the documents.
 */
import { ISignal, Signal } from '@lumino/signaling';

import type { IMe } from './types';

/** Seconds before the stop at which everything is saved a second time. */
export const FINAL_SAVE_S = 30;

/** What the panel says when saving is turned off in the settings. */
export const SAVE_OFF =
  'Unsaved documents are not saved for you (turned off in the settings): save your work before the stop.';

/** Within this many seconds of the floor stop (`floor_at`), it counts as a pending stop to save before. */
export const FLOOR_SAVE_S = 600;

/**
 * The soonest pending stop of the user's GPUs (ISO), or null: the warning of
 * `GET me` unless carried out already, the idle stop of each GPU server, and the
 * floor stop once it is within FLOOR_SAVE_S (issue 39.6: it may come before a
 * cull warning's deadline, and the last save must come before it).
 */
export function pendingStop(
  me: Pick<IMe, 'cull_warning' | 'gpu_servers' | 'floor_at' | 'burn_rate_per_hour'> | null,
  now: number = Date.now()
): string | null {
  if (!me) {
    return null;
  }
  const deadlines: string[] = [];
  const w = me.cull_warning;
  if (w && w.deadline && !w.done_at) {
    deadlines.push(w.deadline);
  }
  const floorAt = me.floor_at && Number(me.burn_rate_per_hour) > 0 ? Date.parse(me.floor_at) : NaN;
  if (!Number.isNaN(floorAt) && floorAt - now <= FLOOR_SAVE_S * 1000) {
    deadlines.push(me.floor_at!);
  }
  for (const s of me.gpu_servers || []) {
    if (s.reclaim_deadline) {
      deadlines.push(s.reclaim_deadline);
    }
  }
  const valid = deadlines.filter(d => !Number.isNaN(Date.parse(d)));
  valid.sort((a, b) => Date.parse(a) - Date.parse(b));
  return valid[0] ?? null;
}

/** Where the saving of one countdown stands; `state` 'none' when no stop is pending. */
export interface ISaveStatus {
  state: 'none' | 'off' | 'saving' | 'saved' | 'failed';
  deadline: string | null;
  /** Documents saved by the last save. */
  saved: number;
  /** When the last save finished (ms since epoch); 0 before. */
  at: number;
  /** Whether the save 30 s before the stop has run. */
  final: boolean;
  error: string | null;
}

const NONE: ISaveStatus = { state: 'none', deadline: null, saved: 0, at: 0, final: false, error: null };

/** "saved 2 documents" / "nothing unsaved": the short words for one save. */
function savedWords(n: number): string {
  return n === 0 ? 'nothing was unsaved' : `${n} document${n === 1 ? '' : 's'} saved`;
}

function clock(at: number): string {
  const d = new Date(at);
  return d.toLocaleTimeString(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

/**
 * The panel's line under a countdown:
 * "Open documents saved at 10:04:05 (2 documents saved); saved again 30 s before the stop."
 */
export function saveNote(s: ISaveStatus): string {
  switch (s.state) {
    case 'none':
      return '';
    case 'off':
      return SAVE_OFF;
    case 'saving':
      return 'Saving your open documents…';
    case 'failed':
      return `Saving your open documents failed: ${s.error ?? 'unknown error'}. Save your work before the stop.`;
    case 'saved':
      return s.final
        ? `Open documents saved again ${FINAL_SAVE_S} s before the stop, at ${clock(s.at)} (${savedWords(s.saved)}).`
        : `Open documents saved at ${clock(s.at)} (${savedWords(s.saved)}); saved again ${FINAL_SAVE_S} s before the stop.`;
  }
}

/** The status bar's short flag: "work saved", "saving off", "save failed", or ''. */
export function saveFlag(s: ISaveStatus): string {
  return { none: '', off: 'saving off', saving: 'saving…', saved: 'work saved', failed: 'save failed' }[s.state];
}

export namespace SaveBeforeStop {
  export interface IOptions {
    /** Saves every open, modified document; resolves to how many it saved. */
    saveAll: () => Promise<number>;
    enabled?: boolean;
    now?: () => number;
    setTimer?: (fn: () => void, ms: number) => unknown;
    clearTimer?: (handle: unknown) => void;
  }
}

/** Saves at the warning and again 30 s before the stop; one instance per page. */
export class SaveBeforeStop {
  constructor(options: SaveBeforeStop.IOptions) {
    this._saveAll = options.saveAll;
    this._enabled = options.enabled ?? true;
    this._now = options.now ?? Date.now;
    this._setTimer = options.setTimer ?? ((fn, ms) => window.setTimeout(fn, ms));
    this._clearTimer = options.clearTimer ?? (h => window.clearTimeout(h as number));
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get status(): ISaveStatus {
    return this._status;
  }

  get enabled(): boolean {
    return this._enabled;
  }

  /** Turn saving on or off (the setting); on again during a countdown saves at once. */
  set enabled(value: boolean) {
    if (value === this._enabled) {
      return;
    }
    this._enabled = value;
    const deadline = this._status.deadline;
    this._reset();
    if (deadline) {
      this.update(deadline);
    }
  }

  /** A new answer of the pool: the soonest pending stop (`pendingStop`), or null. */
  update(deadline: string | null): void {
    if (deadline === this._status.deadline) {
      return;
    }
    this._reset();
    if (!deadline) {
      this._set({});
      return;
    }
    if (!this._enabled) {
      this._set({ state: 'off', deadline });
      return;
    }
    this._status = { ...this._status, deadline };
    const untilFinal = Date.parse(deadline) - FINAL_SAVE_S * 1000 - this._now();
    const final = untilFinal <= 0; // warned with 30 s or less left: this save is the last one
    void this._save(deadline, final);
    if (!final) {
      this._timer = this._setTimer(() => {
        this._timer = null;
        void this._save(deadline, true);
      }, untilFinal);
    }
  }

  dispose(): void {
    this._reset();
    Signal.clearData(this);
  }

  private async _save(deadline: string, final: boolean): Promise<void> {
    this._set({ state: 'saving', deadline, final: this._status.final });
    let saved = 0;
    let error: string | null = null;
    try {
      saved = await this._saveAll();
    } catch (err) {
      error = (err as Error)?.message ?? String(err);
    }
    if (this._status.deadline !== deadline) {
      return; // the countdown ended or changed meanwhile
    }
    this._set({ state: error ? 'failed' : 'saved', deadline, saved, at: this._now(), final, error });
  }

  private _reset(): void {
    if (this._timer !== null) {
      this._clearTimer(this._timer);
      this._timer = null;
    }
    this._status = { ...NONE };
  }

  private _set(change: Partial<ISaveStatus>): void {
    this._status = { ...NONE, ...change };
    this._changed.emit();
  }

  private _changed = new Signal<this, void>(this);
  private _enabled: boolean;
  private _now: () => number;
  private _saveAll: () => Promise<number>;
  private _setTimer: (fn: () => void, ms: number) => unknown;
  private _clearTimer: (handle: unknown) => void;
  private _status: ISaveStatus = { ...NONE };
  private _timer: unknown = null;
}

/** The part of a document widget's context that saving needs (DocumentRegistry.IContext). */
interface ISavableContext {
  path: string;
  model: { dirty: boolean; readOnly?: boolean };
  save(): Promise<void>;
}

function contextOf(widget: unknown): ISavableContext | null {
  const ctx = (widget as { context?: Partial<ISavableContext> } | null)?.context;
  return ctx && typeof ctx.save === 'function' && ctx.model && typeof ctx.path === 'string'
    ? (ctx as ISavableContext)
    : null;
}

/**
 * Save every document among `widgets` (the shell's main area) that has unsaved
 * changes and may be written, each path once; resolves to how many were saved.
 * One that fails does not stop the others; if any failed, the promise rejects
 * naming them after the rest were saved.
 */
export async function saveModified(widgets: Iterable<unknown>): Promise<number> {
  const seen = new Set<string>();
  const saving: Promise<void>[] = [];
  const paths: string[] = [];
  for (const widget of widgets) {
    const ctx = contextOf(widget);
    if (!ctx || seen.has(ctx.path) || !ctx.model.dirty || ctx.model.readOnly) {
      continue;
    }
    seen.add(ctx.path);
    paths.push(ctx.path);
    saving.push(ctx.save());
  }
  const results = await Promise.allSettled(saving);
  const failed = paths.filter((_, i) => results[i].status === 'rejected');
  if (failed.length) {
    throw new Error(`could not save ${failed.join(', ')}`);
  }
  return paths.length;
}

/**
 * Whether any document among `widgets` has unsaved changes: the balance model
 * then keeps polling while the tab is hidden, so that a countdown still
 * reaches a page whose owner walked away from it.
 */
export function hasModified(widgets: Iterable<unknown>): boolean {
  for (const widget of widgets) {
    const ctx = contextOf(widget);
    if (ctx && ctx.model.dirty && !ctx.model.readOnly) {
      return true;
    }
  }
  return false;
}
