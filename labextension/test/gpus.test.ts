import { describe, expect, it } from 'vitest';

import {
  formatGpuActivity,
  formatIdle,
  formatMemory,
  formatSpan,
  formatUtilization,
  formatWaiting,
  hasCountdown,
  ordinal,
  statusNote
} from '../src/gpus';
import type { IGpuServer, IWaiting } from '../src/types';
import { NOW, exampleMe } from './fixtures';

const at = (seconds: number) => new Date(NOW + seconds * 1000).toISOString();

function server(overrides: Partial<IGpuServer> = {}): IGpuServer {
  return {
    allocation: 'a1b2',
    server: '',
    node: 'node-a',
    gpus: [
      {
        uuid: 'GPU-2',
        index: 2,
        model: 'NVIDIA GeForce RTX 3090',
        utilization: 0,
        memory_used_bytes: 1024 ** 3,
        memory_total_bytes: 24 * 1024 ** 3
      }
    ],
    measured_at: at(-30),
    idle_since: at(-45 * 60),
    reclaimable_at: at(15 * 60),
    max_idle_at: null,
    reclaim_deadline: null,
    ...overrides
  };
}

function waiting(overrides: Partial<IWaiting> = {}): IWaiting {
  return {
    server: '',
    request: '2 GPUs (rtx 3090)',
    since: at(-60),
    position: 1,
    queue_length: 1,
    eta: at(20 * 60),
    ...overrides
  };
}

describe('the GPUs at work', () => {
  it('shows utilization and memory, and says when they are unknown', () => {
    expect(formatUtilization(0.374)).toBe('37 %');
    expect(formatUtilization(null)).toBe('—');
    expect(formatMemory(1024 ** 3, 24 * 1024 ** 3)).toBe('1.0 / 24.0 GiB');
    expect(formatMemory(null, null)).toBe('—');
    expect(formatMemory(null, 24 * 1024 ** 3)).toBe('? / 24.0 GiB');
    expect(formatGpuActivity(server().gpus[0])).toBe('RTX 3090 #2: 0 %, 1.0 / 24.0 GiB');
  });

  it.each([
    [30, '<1 min'],
    [45 * 60, '45 min'],
    [65 * 60, '1 h 5 min'],
    [2 * 3600, '2 h'],
    [50 * 3600, '2 d 2 h']
  ])('spans %s s as %s', (seconds, text) => {
    expect(formatSpan(seconds)).toBe(text);
  });

  it('says how long a server is idle and when it may be reclaimed', () => {
    expect(formatIdle(server(), NOW)).toBe('idle 45 min — may be reclaimed in 15 min if someone waits');
    expect(formatIdle(server({ idle_since: at(-7200), reclaimable_at: at(-3600) }), NOW)).toBe(
      'idle 2 h — may be reclaimed if someone waits'
    );
    expect(formatIdle(server({ max_idle_at: at(3 * 3600) }), NOW)).toBe(
      'idle 45 min — may be reclaimed in 15 min if someone waits; stops in 3 h even if nobody waits'
    );
    expect(formatIdle(server({ idle_since: null, reclaimable_at: null }), NOW)).toBe(''); // busy
  });

  it('counts down once someone waits', () => {
    const warned = server({ idle_since: at(-3900), reclaim_deadline: at(299) });
    expect(formatIdle(warned, NOW)).toBe('idle 1 h 5 min — someone is waiting: stops in 4:59');
    expect(formatIdle(warned, NOW + 60_000)).toBe('idle 1 h 6 min — someone is waiting: stops in 3:59');
    const me = exampleMe({ gpu_servers: [warned] });
    expect(statusNote(me, NOW)).toBe('idle: stops in 4:59');
    expect(hasCountdown(me)).toBe(true);
    expect(hasCountdown(exampleMe({ gpu_servers: [server()] }))).toBe(false);
  });

  it('shows the place in the queue and the estimate', () => {
    expect(formatWaiting(waiting(), NOW)).toBe('waiting for 2 GPUs (rtx 3090): 1st in the queue, about 20 min');
    expect(formatWaiting(waiting({ position: 2, queue_length: 3, eta: null }), NOW)).toBe(
      'waiting for 2 GPUs (rtx 3090): 2nd of 3 in the queue, no estimate yet'
    );
    expect(formatWaiting(waiting({ eta: at(30) }), NOW)).toBe(
      'waiting for 2 GPUs (rtx 3090): 1st in the queue, a GPU should free up within a minute'
    );
    expect(formatWaiting(waiting({ position: 0 }), NOW)).toBe('waiting for 2 GPUs (rtx 3090): GPUs reserved, starting');
  });

  it('shows the range learned from history, and the point estimate without it', () => {
    const ranged = { eta_low: at(20 * 60), eta_high: at(45 * 60), eta_text: 'about 20–45 min', eta_basis: 'history' };
    expect(formatWaiting(waiting({ position: 2, queue_length: 3, ...ranged }), NOW)).toBe(
      'waiting for 2 GPUs (rtx 3090): 2nd of 3 in the queue, about 20–45 min'
    );
    // today's rule (no history yet): the point estimate, as before
    expect(formatWaiting(waiting({ ...ranged, eta_text: null, eta_basis: 'fallback' }), NOW)).toBe(
      'waiting for 2 GPUs (rtx 3090): 1st in the queue, about 20 min'
    );
    expect(formatWaiting(waiting({ ...ranged, position: 0 }), NOW)).toBe(
      'waiting for 2 GPUs (rtx 3090): GPUs reserved, starting'
    );
    expect(statusNote(exampleMe({ waiting: [waiting({ position: 3 })] }), NOW)).toBe('queue 3rd');
    expect(statusNote(exampleMe(), NOW)).toBe(''); // an older service without these fields
  });

  it.each([
    [1, '1st'],
    [2, '2nd'],
    [3, '3rd'],
    [4, '4th'],
    [11, '11th'],
    [12, '12th'],
    [21, '21st'],
    [112, '112th']
  ])('ordinal %i → %s', (n, text) => {
    expect(ordinal(n)).toBe(text);
  });
});
