import { describe, expect, it } from 'vitest';

import { formatCullWarning, summarize } from '../src/format';
import { KERNELS_STOPPED, cullDone, noticeFlag } from '../src/notices';
import type { INotice } from '../src/types';
import { NOW, exampleMe } from './fixtures';

const notice: INotice = {
  id: 7,
  kind: 'kernels_stopped',
  at: '2026-11-21T09:00:00Z',
  server: '',
  title: 'Your kernels were stopped and their GPUs taken back',
  why: 'balance below zero',
  kept: 'Your server, notebooks and files are untouched.'
};

describe('a carried-out cull', () => {
  const past = new Date(NOW - 60_000).toISOString();

  it('says the kernels were stopped instead of counting down past zero', () => {
    const warning = { action: 'kernels', reason: 'r', deadline: past, done_at: past };
    expect(cullDone(warning)).toBe(true);
    expect(formatCullWarning(warning, NOW)).toBe(KERNELS_STOPPED);
    expect(formatCullWarning({ ...warning, done_at: null }, NOW)).toBe('kernels stop in 0:00');
  });

  it('shows in the status bar', () => {
    const me = exampleMe({ cull_warning: { action: 'kernels', reason: 'r', deadline: past, done_at: past } });
    expect(summarize(me, NOW).cull).toBe(KERNELS_STOPPED);
  });
});

describe('noticeFlag', () => {
  it.each([
    [[], ''],
    [[notice], '1 notice'],
    [[notice, { ...notice, id: 8 }], '2 notices']
  ])('%j', (notices, flag) => {
    expect(noticeFlag({ notices: notices as INotice[] })).toBe(flag);
  });

  it('is empty when the service sends no notices (older service)', () => {
    expect(noticeFlag({})).toBe('');
  });
});
