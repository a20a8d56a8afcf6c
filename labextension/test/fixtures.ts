import type { IMe } from '../src/types';

/** The `GET me` example from the service contract. */
export function exampleMe(overrides: Partial<IMe> = {}): IMe {
  return {
    user: 'alice',
    balance: '46.000',
    floor: '-10.000',
    unit: 'tokens',
    status: 'fine',
    credits: {
      daily: '1.000',
      monthly: '30.000',
      next_daily_at: '2026-11-22T00:00:00Z',
      next_monthly_at: '2026-12-01T00:00:00Z',
      max_balance: null
    },
    allocations: [
      {
        id: 'a1b2',
        server: '',
        node: 'node-a',
        gpus: [
          { index: 2, uuid: 'GPU-2', model: 'NVIDIA GeForce RTX 3090', fraction: '1.000' }
        ],
        price_per_hour: '2.000',
        borrowed: false,
        started_at: '2026-11-21T09:00:00Z',
        description: 'node-a, GPUs 2+3 joined by NVLink'
      }
    ],
    burn_rate_per_hour: '2.000',
    time_to_floor_seconds: 100800,
    last_debit_at: '2026-11-21T10:00:00Z',
    accounting: { status: 'ok', message: null },
    cull_warning: null,
    ...overrides
  };
}

export const NOW = Date.parse('2026-11-21T10:05:00Z');
