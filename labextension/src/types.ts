/**
 * The JSON answered by the gpupool service's `GET /services/gpupool/api/v1/me`
 * (and forwarded unchanged by the server extension at `{base_url}gpupool/me`).
 *
 * Amounts are decimal strings ("46.000"), times ISO-8601 UTC strings.
 */

import type { IMemoryWarning } from './memory';

/** Server-computed balance state. */
export type BalanceStatus = 'fine' | 'low' | 'negative' | 'floor';

export interface IGpu {
  index: number;
  uuid: string;
  model: string;
  /** Share of the GPU held, "1.000" for a whole GPU. */
  fraction: string;
}

export interface IAllocation {
  id: string;
  /** Named server ("" for the default server). */
  server: string;
  node: string;
  gpus: IGpu[];
  price_per_hour: string;
  /** Held on a GPU lent from another group/user. */
  borrowed: boolean;
  started_at: string | null;
  description: string | null;
}

export interface ICredits {
  daily: string | null;
  monthly: string | null;
  next_daily_at: string | null;
  next_monthly_at: string | null;
  max_balance: string | null;
}

export interface IAccounting {
  status: 'ok' | 'delayed';
  message: string | null;
}

export interface ICullWarning {
  action: 'kernels' | 'server';
  reason: string;
  deadline: string;
  /** When the kernels were shut down while the warning still stands; null before. */
  done_at?: string | null;
}

/** What the pool did to one of the user's servers; shown until dismissed. */
export interface INotice {
  id: number;
  kind: 'preempted' | 'kernels_stopped' | 'floor_stop' | 'idle_reclaim';
  at: string;
  server: string;
  /** `what` and `because` together, without the time. */
  title: string;
  /** "Your GPU server was stopped": the widget says when after it (absent before issue 39). */
  what?: string;
  /** "because your balance reached the floor (−10 tokens)". */
  because?: string;
  why: string;
  /** What was kept (files on disk). */
  kept: string;
}

/** One held GPU as last measured by the service's idle job (null: unknown). */
export interface IGpuActivity {
  uuid: string;
  index: number;
  model: string;
  /** 0-1. */
  utilization: number | null;
  memory_used_bytes: number | null;
  memory_total_bytes: number | null;
}

/** One of the user's GPU servers: its GPUs as measured and how idle it is. */
export interface IGpuServer {
  allocation: string;
  server: string;
  node: string;
  gpus: IGpuActivity[];
  measured_at: string | null;
  /** Every GPU under the idle threshold since (null: busy or unknown). */
  idle_since: string | null;
  /** From then on it may be stopped if someone waits for its GPUs. */
  reclaimable_at: string | null;
  /** Stopped then even if nobody waits (max_idle), when set. */
  max_idle_at: string | null;
  /** Someone waits: the server stops then unless its GPUs get busy. */
  reclaim_deadline: string | null;
}

/** One of the user's servers waiting for GPUs. */
export interface IWaiting {
  server: string;
  request: string;
  since: string;
  /** 1 = next; 0 = GPUs reserved, starting. */
  position: number;
  queue_length: number;
  eta: string | null;
  /** The range learned from the pool's history (absent from services before issue 25). */
  eta_low?: string | null;
  eta_high?: string | null;
  /** "about 20–45 min", as the service says it; null without history. */
  eta_text?: string | null;
  /** "history" (a range) or "fallback" (today's point estimate). */
  eta_basis?: string | null;
}

export interface IMe {
  user: string;
  balance: string;
  floor: string;
  unit: string;
  status: BalanceStatus;
  credits: ICredits | null;
  allocations: IAllocation[];
  burn_rate_per_hour: string;
  /** From the balance the GPU time used so far leaves (issue 39.6: not only what was charged). */
  time_to_floor_seconds: number | null;
  /** When GPU servers are stopped at the floor; null when nothing charges (absent before issue 39). */
  floor_at?: string | null;
  last_debit_at: string | null;
  accounting: IAccounting | null;
  cull_warning: ICullWarning | null;
  /** Absent from services before issue 14. */
  gpu_servers?: IGpuServer[];
  waiting?: IWaiting[];
  /** A time-shared GPU share over its memory (absent from older services). */
  memory_warnings?: IMemoryWarning[];
  notices?: INotice[];
  /** The service's "My GPU usage" page, added by the server extension. */
  pages_url?: string;
}

/** What the server extension answers when it cannot get the balance. */
export interface IUnavailable {
  error: string;
  reason?: string;
}
