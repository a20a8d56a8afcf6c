/**
 * Issue 39.6: near the floor the widget names the next thing that happens and when: the
 * floor stop of GPU servers, or a cull warning's deadline, whichever comes first.
 */
import { describe, expect, it } from 'vitest';

import { MINUS, floorStopAt, formatFloor, formatFloorStop, summarize } from '../src/format';
import { floorStopDetail, noticeHeadline, noticeTime } from '../src/notices';
import type { ICullWarning, IMe } from '../src/types';
import { NOW, exampleMe } from './fixtures';

const inMinutes = (m: number) => new Date(NOW + m * 60_000).toISOString();

/** −9.6 tokens, 2.4 tokens/h: the floor (−10) 10 minutes away, as the service says it. */
function nearFloor(overrides: Partial<IMe> = {}): IMe {
  return exampleMe({
    balance: '-9.600',
    status: 'negative',
    burn_rate_per_hour: '2.400',
    time_to_floor_seconds: 600,
    floor_at: inMinutes(10),
    ...overrides
  });
}

const kernelsIn = (minutes: number): ICullWarning => ({
  action: 'kernels',
  reason: 'balance -9.600 is below zero and the pool is under pressure',
  deadline: inMinutes(minutes),
  done_at: null
});

describe('the floor stop', () => {
  it('is named in the status bar when it is near, with the floor and the time left', () => {
    const s = summarize(nearFloor(), NOW);
    expect(s.left).toBe(`GPU servers stop at the floor (${MINUS}10) in ~10 min`);
    expect(s.floorNear).toBe(true);
    expect(s.floorFirst).toBe(false);
    expect(s.cull).toBe('');
    expect(s.title).toContain(`GPU servers stop at the floor (${MINUS}10) in ~10 min`);
  });

  it('stays "~28 h left" while the floor is far', () => {
    const s = summarize(exampleMe({ floor_at: inMinutes(28 * 60) }), NOW);
    expect(s.left).toBe('~28 h left');
    expect(s.floorNear).toBe(false);
    expect(s.title).toContain(`GPU servers stop at the floor (${MINUS}10) in ~28 h`);
  });

  it('comes before a cull warning whose deadline is later: the warning span names the floor', () => {
    // the case: kernels stop in 9:42, while the floor is reached in 6 minutes
    const s = summarize(nearFloor({ floor_at: inMinutes(6), cull_warning: kernelsIn(9.7) }), NOW);
    expect(s.floorFirst).toBe(true);
    expect(s.cull).toBe(`GPU servers stop at the floor (${MINUS}10) in ~6 min`);
    expect(s.left).toBe(''); // said once
    expect(s.title).toContain(
      `WARNING: GPU servers stop at the floor (${MINUS}10) in ~6 min, before the cull warning's kernels stop in 9:42`
    );
  });

  it('leaves the cull warning first when its deadline comes sooner, and still names the floor', () => {
    const s = summarize(nearFloor({ cull_warning: kernelsIn(5) }), NOW);
    expect(s.floorFirst).toBe(false);
    expect(s.cull).toBe('kernels stop in 5:00');
    expect(s.left).toBe(`GPU servers stop at the floor (${MINUS}10) in ~10 min`);
  });

  it('says the stop is now once the floor is reached', () => {
    const s = summarize(nearFloor({ floor_at: inMinutes(-1), time_to_floor_seconds: 0 }), NOW);
    expect(s.left).toBe(`GPU servers stop now: the balance is at the floor (${MINUS}10)`);
  });

  it('is silent when nothing charges', () => {
    const me = nearFloor({ burn_rate_per_hour: '0.000', allocations: [], floor_at: null, time_to_floor_seconds: null });
    expect(formatFloorStop(me, NOW)).toBe('');
    expect(summarize(me, NOW).left).toBe('');
  });

  it('counts from time_to_floor_seconds with a service that sends no floor_at', () => {
    const me = nearFloor({ floor_at: undefined, time_to_floor_seconds: 1500 });
    expect(floorStopAt(me, NOW)).toBe(NOW + 1_500_000);
    expect(summarize(me, NOW).left).toBe(`GPU servers stop at the floor (${MINUS}10) in ~25 min`);
  });

  it.each([
    ['-10.000', `${MINUS}10`],
    ['-12.500', `${MINUS}12.5`],
    ['0.000', '0']
  ])('words the floor %s as %s', (floor, words) => {
    expect(formatFloor(floor)).toBe(words);
  });

  it('says in the panel when, in local time, and what it means', () => {
    expect(floorStopDetail('14:02')).toBe(
      'At about 14:02, your balance reaches the floor and servers holding GPUs are stopped; notebooks and files ' +
        'stay on disk. Save your work now; a server without GPUs can still be started.'
    );
  });
});

describe('a floor-stop notice', () => {
  const notice = {
    at: new Date(NOW - 3 * 60_000).toISOString(),
    title: `Your GPU server was stopped because your balance reached the floor (${MINUS}10 tokens)`,
    what: 'Your GPU server was stopped',
    because: `because your balance reached the floor (${MINUS}10 tokens)`
  };

  it('says when between what happened and why, in local time', () => {
    const time = noticeTime(notice.at, NOW);
    expect(time).toMatch(/^\d{1,2}:\d{2}( [AP]M)?$/); // today: the time alone
    expect(noticeHeadline(notice, NOW)).toBe(
      `Your GPU server was stopped at ${time} because your balance reached the floor (${MINUS}10 tokens)`
    );
  });

  it('names the day of an older notice', () => {
    expect(noticeTime(new Date(NOW - 3 * 86_400_000).toISOString(), NOW)).toMatch(/\w{3}.*\d.*, \d{1,2}:\d{2}/);
  });

  it("shows an older service's title alone", () => {
    expect(noticeHeadline({ at: notice.at, title: 'Your server was stopped: your balance reached the floor' }, NOW)).toBe(
      'Your server was stopped: your balance reached the floor'
    );
  });
});
