import { describe, expect, it, vi } from 'vitest';

import { BalanceModel } from '../src/model';
import {
  FINAL_SAVE_S,
  FLOOR_SAVE_S,
  hasModified,
  pendingStop,
  SAVE_OFF,
  saveFlag,
  saveModified,
  saveNote,
  SaveBeforeStop
} from '../src/save';
import type { IGpuServer } from '../src/types';
import { NOW, exampleMe } from './fixtures';

const at = (s: number) => new Date(NOW + s * 1000).toISOString();

function idleServer(deadline: string | null): IGpuServer {
  return {
    allocation: 'a1', server: '', node: 'n', gpus: [], measured_at: null, idle_since: null,
    reclaimable_at: null, max_idle_at: null, reclaim_deadline: deadline
  };
}

describe('pendingStop', () => {
  it('is the soonest of the warning and the idle stops', () => {
    const me = exampleMe({
      cull_warning: { action: 'server', reason: 'reclaimed', deadline: at(300) },
      gpu_servers: [idleServer(at(120)), idleServer(null)]
    });
    expect(pendingStop(me)).toBe(at(120));
  });

  it('counts the floor stop once it is within ten minutes, before a later cull warning', () => {
    const warned = { action: 'kernels' as const, reason: 'r', deadline: at(582) };
    const near = exampleMe({ burn_rate_per_hour: '2.400', floor_at: at(360), cull_warning: warned });
    expect(pendingStop(near, NOW)).toBe(at(360)); // the last save comes before the floor stop
    expect(pendingStop(exampleMe({ floor_at: at(FLOOR_SAVE_S + 60) }), NOW)).toBeNull(); // not yet
    expect(pendingStop(exampleMe({ floor_at: at(FLOOR_SAVE_S) }), NOW)).toBe(at(FLOOR_SAVE_S));
    // nothing charging: no floor stop to come
    expect(pendingStop(exampleMe({ burn_rate_per_hour: '0.000', floor_at: at(60) }), NOW)).toBeNull();
  });

  it('ignores a warning already carried out, and nothing pending is null', () => {
    const done = { action: 'kernels' as const, reason: 'r', deadline: at(-5), done_at: at(-5) };
    expect(pendingStop(exampleMe({ cull_warning: done }))).toBeNull();
    expect(pendingStop(exampleMe())).toBeNull();
    expect(pendingStop(null)).toBeNull();
  });
});

/** A saver on a fake clock and timers; `saves` counts the calls of saveAll. */
function fakeSaver(options: { enabled?: boolean; fail?: boolean } = {}) {
  let now = NOW;
  const timers: { fn: () => void; due: number }[] = [];
  const saveAll = vi.fn(async () => {
    if (options.fail) {
      throw new Error('disk full');
    }
    return 2;
  });
  const saver = new SaveBeforeStop({
    saveAll,
    enabled: options.enabled,
    now: () => now,
    setTimer: (fn, ms) => {
      const t = { fn, due: now + ms };
      timers.push(t);
      return t;
    },
    clearTimer: t => timers.splice(timers.indexOf(t as (typeof timers)[0]), 1)
  });
  const advance = (seconds: number) => {
    now += seconds * 1000;
    for (const t of timers.filter(x => x.due <= now)) {
      timers.splice(timers.indexOf(t), 1);
      t.fn();
    }
  };
  return { saver, saveAll, advance, timers };
}

describe('SaveBeforeStop', () => {
  it('saves at the warning and again 30 s before the stop, once each', async () => {
    const { saver, saveAll, advance } = fakeSaver();
    saver.update(at(600));
    await vi.waitFor(() => expect(saver.status.state).toBe('saved'));
    expect(saveAll).toHaveBeenCalledTimes(1);
    expect(saver.status).toMatchObject({ saved: 2, final: false, deadline: at(600) });
    expect(saveNote(saver.status)).toMatch(/^Open documents saved at .* \(2 documents saved\); saved again 30 s before the stop\.$/);
    expect(saveFlag(saver.status)).toBe('work saved');

    saver.update(at(600)); // the next poll says the same: nothing more
    advance(600 - FINAL_SAVE_S - 1);
    expect(saveAll).toHaveBeenCalledTimes(1);
    advance(1);
    await vi.waitFor(() => expect(saver.status.final).toBe(true));
    expect(saveAll).toHaveBeenCalledTimes(2);
    expect(saveNote(saver.status)).toMatch(/^Open documents saved again 30 s before the stop, at /);
  });

  it('saves once when warned with 30 s or less left', async () => {
    const { saver, saveAll, timers } = fakeSaver();
    saver.update(at(20));
    await vi.waitFor(() => expect(saver.status.state).toBe('saved'));
    expect(saver.status.final).toBe(true);
    expect(saveAll).toHaveBeenCalledTimes(1);
    expect(timers).toHaveLength(0);
  });

  it('drops the second save when the countdown ends (busy again, nobody waits)', async () => {
    const { saver, saveAll, advance } = fakeSaver();
    saver.update(at(600));
    await vi.waitFor(() => expect(saver.status.state).toBe('saved'));
    saver.update(null);
    expect(saver.status.state).toBe('none');
    advance(600);
    expect(saveAll).toHaveBeenCalledTimes(1);
  });

  it('saves nothing when turned off, and says so; turned on during a countdown, saves at once', async () => {
    const { saver, saveAll } = fakeSaver({ enabled: false });
    saver.update(at(600));
    expect(saver.status.state).toBe('off');
    expect(saveNote(saver.status)).toBe(SAVE_OFF);
    expect(saveFlag(saver.status)).toBe('saving off');
    expect(saveAll).not.toHaveBeenCalled();
    saver.enabled = true;
    await vi.waitFor(() => expect(saver.status.state).toBe('saved'));
    expect(saveAll).toHaveBeenCalledTimes(1);
  });

  it('says when saving failed', async () => {
    const { saver } = fakeSaver({ fail: true });
    saver.update(at(600));
    await vi.waitFor(() => expect(saver.status.state).toBe('failed'));
    expect(saveNote(saver.status)).toBe('Saving your open documents failed: disk full. Save your work before the stop.');
    expect(saveFlag(saver.status)).toBe('save failed');
  });
});

function doc(path: string, dirty: boolean, readOnly = false) {
  return { context: { path, model: { dirty, readOnly }, save: vi.fn(async () => undefined) } };
}

describe('saveModified', () => {
  it('saves each modified, writable document once and counts them', async () => {
    const a = doc('a.ipynb', true);
    const a2 = doc('a.ipynb', true); // a second view of the same file
    const clean = doc('b.py', false);
    const locked = doc('c.txt', true, true);
    const widgets = [a, a2, clean, locked, { title: 'Launcher' }];
    expect(hasModified(widgets)).toBe(true);
    expect(await saveModified(widgets)).toBe(1);
    expect(a.context.save).toHaveBeenCalledTimes(1);
    expect(a2.context.save).not.toHaveBeenCalled();
    expect(clean.context.save).not.toHaveBeenCalled();
    expect(locked.context.save).not.toHaveBeenCalled();
    expect(hasModified([clean, locked])).toBe(false);
  });

  it('saves the others when one fails, then names it', async () => {
    const bad = doc('bad.ipynb', true);
    bad.context.save.mockRejectedValue(new Error('permission denied'));
    const good = doc('good.ipynb', true);
    await expect(saveModified([bad, good])).rejects.toThrow('could not save bad.ipynb');
    expect(good.context.save).toHaveBeenCalledTimes(1);
  });
});

describe('BalanceModel keepAwake', () => {
  it('stands by in a hidden tab unless there is unsaved work', () => {
    let dirty = false;
    const model = new BalanceModel({ auto: false, keepAwake: () => dirty });
    const standby = model.poll.standby as () => boolean;
    vi.stubGlobal('document', { hidden: true });
    try {
      expect(standby()).toBe(true);
      dirty = true;
      expect(standby()).toBe(false);
    } finally {
      vi.unstubAllGlobals();
      model.dispose();
    }
  });
});
