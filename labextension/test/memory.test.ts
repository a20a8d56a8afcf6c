import { describe, expect, it } from 'vitest';

import { type IMemoryWarning, formatGiB, memoryFlag, memoryWarningText } from '../src/memory';
import { NOW } from './fixtures';

const GIB = 1024 ** 3;

function warning(overrides: Partial<IMemoryWarning> = {}): IMemoryWarning {
  return {
    server: '',
    gpu_uuid: 'GPU-0',
    gpu_index: 0,
    fraction_milli: 500,
    limit_bytes: 44 * GIB,
    used_bytes: 50 * GIB,
    since: '2026-11-21T10:04:00Z',
    deadline: '2026-11-21T10:07:00Z',
    ...overrides
  };
}

describe('memory warnings', () => {
  it('say the limit, the use, when and what stops', () => {
    const text = memoryWarningText(warning(), NOW);
    expect(text.title).toBe('GPU memory over your share: 50.0 GiB of 44.0 GiB allowed');
    expect(text.detail).toContain('Your 0.5 share of GPU 0 may hold 44.0 GiB of GPU memory.');
    expect(text.detail).toContain('In 2:00 your processes using the most GPU memory on it are stopped');
    expect(memoryWarningText(warning({ server: 'big' }), NOW).detail).toContain('GPU 0 (server big)');
  });

  it('flag the status bar only when there is a warning', () => {
    expect(memoryFlag([warning()])).toBe('GPU memory 50.0/44.0 GiB');
    expect(memoryFlag([])).toBe('');
    expect(memoryFlag(undefined)).toBe('');
    expect(formatGiB(1.5 * GIB)).toBe('1.5 GiB');
  });
});
