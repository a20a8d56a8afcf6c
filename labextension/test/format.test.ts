import { describe, expect, it } from 'vitest';

import {
  MINUS,
  displayState,
  formatAmount,
  formatBurn,
  formatCountdown,
  formatCullWarning,
  formatDuration,
  formatGpu,
  formatPrice,
  formatRelative,
  roundDecimal,
  summarize
} from '../src/format';
import { NOW, exampleMe } from './fixtures';

describe('roundDecimal', () => {
  it.each([
    ['46.000', '46.0'],
    ['46', '46.0'],
    ['0.05', '0.1'],
    ['2.05', '2.1'], // 2.05 is 2.04999… as a float; string rounding keeps it exact
    ['2.04999', '2.0'],
    ['9.96', '10.0'],
    ['-3.25', `${MINUS}3.3`],
    ['-0.04', '0.0'], // never "−0.0"
    ['+1.5', '1.5'],
    ['.5', '0.5'],
    ['12345678901234567890.06', '12345678901234567890.1']
  ])('%s → %s', (input, expected) => {
    expect(roundDecimal(input, 1)).toBe(expected);
  });

  it('rounds numbers and other precisions', () => {
    expect(roundDecimal(2.5, 0)).toBe('3');
    expect(roundDecimal(0.125, 2)).toBe('0.13');
    expect(roundDecimal(-1, 1)).toBe(`${MINUS}1.0`);
  });

  it.each([[null], [undefined], [''], ['abc'], ['1.2.3'], ['.'], [NaN], [Infinity]])(
    'rejects %s',
    input => {
      expect(roundDecimal(input as never, 1)).toBeNull();
    }
  );
});

describe('formatAmount', () => {
  it('shows one decimal and the unit', () => {
    expect(formatAmount('46.000', 'tokens')).toBe('46.0 tokens');
    expect(formatAmount('-10.000', 'tokens')).toBe(`${MINUS}10.0 tokens`);
    expect(formatAmount('3', '')).toBe('3.0');
    expect(formatAmount('junk', 'tokens')).toBe('? tokens');
  });
});

describe('formatBurn', () => {
  it('uses U+2212 and /h', () => {
    expect(formatBurn('2.000')).toBe('\u22122.0/h');
    expect(formatBurn('0.75')).toBe('\u22120.8/h');
    expect(formatBurn(1.25)).toBe('\u22121.3/h');
  });
  it('is hidden when nothing burns', () => {
    expect(formatBurn('0.000')).toBe('');
    expect(formatBurn('0')).toBe('');
    expect(formatBurn(null)).toBe('');
    expect(formatBurn(undefined)).toBe('');
    expect(formatBurn('-1')).toBe('');
  });
  it('never shows a burning rate as zero', () => {
    expect(formatBurn('0.01')).toBe('\u2212<0.1/h');
  });
});

describe('formatDuration', () => {
  it.each([
    [100800, '~28 h'],
    [2700, '~45 min'],
    [59, '<1 min'],
    [60, '~1 min'],
    [3569, '~59 min'],
    [3599, '~1 h'],
    [5400, '~2 h'],
    [71 * 3600, '~71 h'],
    [5 * 86400, '~5 d'],
    [0, 'now'],
    [-5, 'now']
  ])('%s s → %s', (seconds, expected) => {
    expect(formatDuration(seconds)).toBe(expected);
  });
  it('is empty for null', () => {
    expect(formatDuration(null)).toBe('');
    expect(formatDuration(undefined)).toBe('');
  });
});

describe('formatCountdown / formatRelative', () => {
  it('counts down to a deadline', () => {
    expect(formatCountdown('2026-11-21T10:10:00Z', NOW)).toBe('5:00');
    expect(formatCountdown('2026-11-21T10:09:59.2Z', NOW)).toBe('5:00');
    expect(formatCountdown('2026-11-21T11:07:03Z', NOW)).toBe('1:02:03');
    expect(formatCountdown('2026-11-21T10:00:00Z', NOW)).toBe('0:00');
    expect(formatCountdown('not a date', NOW)).toBe('');
    expect(formatCountdown(null, NOW)).toBe('');
  });
  it('describes times relative to now', () => {
    expect(formatRelative('2026-11-21T10:00:00Z', NOW)).toBe('~5 min ago');
    expect(formatRelative('2026-11-22T00:00:00Z', NOW)).toBe('in ~14 h');
    expect(formatRelative('2026-12-01T00:00:00Z', NOW)).toBe('in ~10 d');
    expect(formatRelative('2026-11-21T10:04:30Z', NOW)).toBe('just now');
    expect(formatRelative(null, NOW)).toBe('');
  });
  it('words the cull warning', () => {
    expect(
      formatCullWarning({ action: 'kernels', deadline: '2026-11-21T10:10:00Z' }, NOW)
    ).toBe('kernels stop in 5:00');
    expect(
      formatCullWarning({ action: 'server', deadline: '2026-11-21T10:06:05Z' }, NOW)
    ).toBe('server stops in 1:05');
    expect(formatCullWarning(null, NOW)).toBe('');
  });
});

describe('state', () => {
  it('follows the server status', () => {
    for (const status of ['fine', 'low', 'negative', 'floor'] as const) {
      expect(displayState({ status, balance: '1' })).toBe(status);
    }
  });
  it('falls back to the sign of the balance for an unknown status', () => {
    expect(displayState({ status: 'weird' as never, balance: '-1.000' })).toBe('negative');
    expect(displayState({ status: undefined as never, balance: '5' })).toBe('fine');
  });
});

describe('GPUs', () => {
  it('names a GPU and its share', () => {
    expect(formatGpu({ index: 2, model: 'NVIDIA GeForce RTX 3090', fraction: '1.000' })).toBe(
      'NVIDIA GeForce RTX 3090 #2'
    );
    expect(formatGpu({ index: 0, model: 'A100', fraction: '0.500' })).toBe('A100 #0 (0.50 GPU)');
    expect(formatPrice({ price_per_hour: '2.000' })).toBe('2.0 tokens/h');
  });
});

describe('summarize', () => {
  it('summarizes the contract example', () => {
    const s = summarize(exampleMe(), NOW);
    expect(s).toMatchObject({
      state: 'fine',
      balance: '46.0 tokens',
      burn: '\u22122.0/h',
      timeLeft: '~28 h',
      cull: '',
      borrowed: false,
      delayed: false
    });
    expect(s.title).toContain('46.0 tokens');
  });

  it('hides burn and time left when nothing runs', () => {
    const s = summarize(
      exampleMe({ allocations: [], burn_rate_per_hour: '0.000', time_to_floor_seconds: null }),
      NOW
    );
    expect(s.burn).toBe('');
    expect(s.timeLeft).toBe('');
    expect(s.title).toContain('no GPU server running');
  });

  it('shows negative balances, cull warnings, borrowed GPUs and delayed accounting', () => {
    const base = exampleMe();
    const s = summarize(
      exampleMe({
        balance: '-3.500',
        status: 'negative',
        allocations: [{ ...base.allocations[0], borrowed: true }],
        accounting: { status: 'delayed', message: 'Prometheus unreachable since 10:00' },
        cull_warning: {
          action: 'server',
          reason: 'balance below the floor',
          deadline: '2026-11-21T10:15:00Z'
        }
      }),
      NOW
    );
    expect(s.state).toBe('negative');
    expect(s.balance).toBe(`${MINUS}3.5 tokens`);
    expect(s.cull).toBe('server stops in 10:00');
    expect(s.borrowed).toBe(true);
    expect(s.delayed).toBe(true);
    expect(s.title).toContain('WARNING: server stops in 10:00: balance below the floor');
  });
});
