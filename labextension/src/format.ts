/**
 * Pure formatting and state helpers for the balance widget (no DOM, no
 * JupyterLab imports: unit-tested with vitest in test/format.test.ts).
 */
import type { BalanceStatus, IAllocation, IMe } from './types';
import { cullDone, KERNELS_STOPPED } from './notices';

/** U+2212 MINUS SIGN, used for every negative amount shown. */
export const MINUS = '\u2212';

const DECIMAL = /^\s*([+-]?)(\d*)(?:\.(\d*))?\s*$/;

/**
 * Round a decimal string (or number) to `places` decimals, half away from
 * zero, without going through binary floating point ("2.05" → "2.1").
 * Negative values get U+2212; a value that rounds to zero is never negative.
 * Returns null for something that is not a decimal.
 */
export function roundDecimal(
  value: string | number | null | undefined,
  places = 1
): string | null {
  if (value === null || value === undefined) {
    return null;
  }
  let text: string;
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) {
      return null;
    }
    // toFixed(12) is exact enough for the amounts shown and avoids "1e-7".
    text = value.toFixed(Math.max(places + 3, 12));
  } else {
    text = value;
  }
  const m = DECIMAL.exec(text);
  if (!m || (m[2] === '' && (m[3] === undefined || m[3] === ''))) {
    return null;
  }
  const negative = m[1] === '-';
  const intPart = m[2] || '0';
  const frac = (m[3] || '').padEnd(places + 1, '0');
  // Work on the digits as a BigInt scaled by 10^places.
  let scaled = BigInt(intPart + frac.slice(0, places));
  const next = Number(frac[places]);
  if (next >= 5) {
    scaled += 1n;
  }
  let digits = scaled.toString();
  if (places > 0) {
    digits = digits.padStart(places + 1, '0');
    digits = `${digits.slice(0, -places)}.${digits.slice(-places)}`;
  }
  return negative && scaled !== 0n ? MINUS + digits : digits;
}

/** Parse a decimal string as a number (NaN when it is not one). */
export function toNumber(value: string | number | null | undefined): number {
  if (value === null || value === undefined || value === '') {
    return NaN;
  }
  return typeof value === 'number' ? value : Number(value);
}

/** "46.000", "tokens" → "46.0 tokens"; "-3.25" → "−3.3 tokens". */
export function formatAmount(value: string | number, unit = 'tokens'): string {
  const rounded = roundDecimal(value, 1) ?? '?';
  return unit ? `${rounded} ${unit}` : rounded;
}

/**
 * The burn rate of the running GPU servers, "2.000" → "−2.0/h".
 * Empty string when nothing burns (0, missing or not a number).
 */
export function formatBurn(rate: string | number | null | undefined): string {
  const n = toNumber(rate);
  if (!Number.isFinite(n) || n <= 0) {
    return '';
  }
  const rounded = roundDecimal(rate as string | number, 1);
  if (rounded === '0.0') {
    return `${MINUS}<0.1/h`;
  }
  return `${MINUS}${rounded}/h`;
}

/**
 * An approximate duration: "~45 min", "~28 h", "~5 d" (from 72 h on),
 * "<1 min". Empty string for null/undefined; "now" for 0 or less.
 */
export function formatDuration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) {
    return '';
  }
  if (seconds <= 0) {
    return 'now';
  }
  if (seconds < 60) {
    return '<1 min';
  }
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) {
    return `~${minutes} min`;
  }
  const hours = Math.round(seconds / 3600);
  if (hours < 72) {
    return `~${hours} h`;
  }
  return `~${Math.round(seconds / 86400)} d`;
}

/** Seconds from `now` until the ISO time `iso` (negative when past); NaN if unparsable. */
export function secondsUntil(iso: string | null | undefined, now: number): number {
  if (!iso) {
    return NaN;
  }
  const t = Date.parse(iso);
  return Number.isNaN(t) ? NaN : (t - now) / 1000;
}

/** A countdown to an ISO deadline: "4:59", "1:02:03"; "0:00" once past. */
export function formatCountdown(deadline: string | null | undefined, now: number): string {
  const left = secondsUntil(deadline, now);
  if (Number.isNaN(left)) {
    return '';
  }
  const total = Math.max(0, Math.ceil(left));
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const s = total % 60;
  const ss = String(s).padStart(2, '0');
  return h > 0 ? `${h}:${String(m).padStart(2, '0')}:${ss}` : `${m}:${ss}`;
}

/** "in ~13 h" / "~3 min ago" / "just now"; empty for null or unparsable. */
export function formatRelative(iso: string | null | undefined, now: number): string {
  const delta = secondsUntil(iso, now);
  if (Number.isNaN(delta)) {
    return '';
  }
  if (Math.abs(delta) < 60) {
    return delta >= 0 ? 'in <1 min' : 'just now';
  }
  const text = formatDuration(Math.abs(delta));
  return delta > 0 ? `in ${text}` : `${text} ago`;
}

/** Display state: the server's status; falls back to the sign of the balance. */
export function displayState(me: Pick<IMe, 'status' | 'balance'>): BalanceStatus {
  const known: BalanceStatus[] = ['fine', 'low', 'negative', 'floor'];
  if (known.includes(me.status)) {
    return me.status;
  }
  return toNumber(me.balance) < 0 ? 'negative' : 'fine';
}

/** A short label for a state, for tooltips and the panel. */
export function stateLabel(state: BalanceStatus): string {
  switch (state) {
    case 'fine':
      return 'balance fine';
    case 'low':
      return 'balance low';
    case 'negative':
      return 'balance negative';
    case 'floor':
      return 'balance at the floor: GPU servers will be stopped';
  }
}

/** "NVIDIA GeForce RTX 3090 #2", with "(½)"-style share when fractional. */
export function formatGpu(gpu: { index: number; model: string; fraction: string }): string {
  const share = toNumber(gpu.fraction);
  const part =
    Number.isFinite(share) && share > 0 && share < 1
      ? ` (${roundDecimal(gpu.fraction, 2)} GPU)`
      : '';
  return `${gpu.model || 'GPU'} #${gpu.index}${part}`;
}

/** "2.0 tokens/h" for an allocation's price. */
export function formatPrice(alloc: Pick<IAllocation, 'price_per_hour'>, unit = 'tokens'): string {
  return `${roundDecimal(alloc.price_per_hour, 1) ?? '?'} ${unit}/h`;
}

/** What the cull warning says, with its countdown. */
export function formatCullWarning(
  warning: { action: string; deadline: string; done_at?: string | null } | null | undefined,
  now: number
): string {
  if (!warning) {
    return '';
  }
  if (cullDone(warning)) {
    return KERNELS_STOPPED;
  }
  const what = warning.action === 'server' ? 'server stops' : 'kernels stop';
  return `${what} in ${formatCountdown(warning.deadline, now)}`;
}

/** Within this many seconds of the floor, the status bar says what happens there instead of "~2 h left". */
export const NEAR_FLOOR_S = 3600;

/** The floor as the notices word it: "−10", "−12.5". */
export function formatFloor(value: string | number): string {
  const rounded = roundDecimal(value, 1) ?? '?';
  return rounded.endsWith('.0') ? rounded.slice(0, -2) : rounded;
}

/**
 * When GPU servers are stopped at the floor (ms since epoch); NaN when nothing charges.
 * The service's `floor_at` counts the GPU time used but not charged yet; an older
 * service gives only `time_to_floor_seconds`, counted from now.
 */
export function floorStopAt(me: Pick<IMe, 'burn_rate_per_hour' | 'floor_at' | 'time_to_floor_seconds'>, now: number): number {
  if (!formatBurn(me.burn_rate_per_hour)) {
    return NaN;
  }
  const at = me.floor_at ? Date.parse(me.floor_at) : NaN;
  if (!Number.isNaN(at)) {
    return at;
  }
  const s = me.time_to_floor_seconds;
  return typeof s === 'number' && Number.isFinite(s) ? now + s * 1000 : NaN;
}

/** "GPU servers stop at the floor (−10) in ~10 min"; empty when nothing charges. */
export function formatFloorStop(me: Pick<IMe, 'burn_rate_per_hour' | 'floor_at' | 'time_to_floor_seconds' | 'floor'>, now: number): string {
  const at = floorStopAt(me, now);
  if (Number.isNaN(at)) {
    return '';
  }
  const floor = `the floor (${formatFloor(me.floor)})`;
  const left = (at - now) / 1000;
  return left <= 0 ? `GPU servers stop now: the balance is at ${floor}` : `GPU servers stop at ${floor} in ${formatDuration(left)}`;
}

/** Everything the status-bar item shows, derived from one `GET me` answer. */
export interface ISummary {
  state: BalanceStatus;
  balance: string;
  burn: string;
  timeLeft: string;
  /** The status bar's span after the burn: "~28 h left", or near the floor what happens there. */
  left: string;
  /** The warning span: the cull warning's countdown, or the floor stop when it comes first. */
  cull: string;
  /** What the floor brings ("GPU servers stop at the floor (−10) in ~10 min"), '' when nothing charges. */
  floorStop: string;
  /** The floor stop comes at or before a standing cull warning's deadline: it is the next thing. */
  floorFirst: boolean;
  /** The floor stop is within NEAR_FLOOR_S (or a cull warning comes after it). */
  floorNear: boolean;
  borrowed: boolean;
  delayed: boolean;
  title: string;
}

export function summarize(me: IMe, now: number): ISummary {
  const state = displayState(me);
  const balance = formatAmount(me.balance, me.unit);
  const burn = formatBurn(me.burn_rate_per_hour);
  const floorAt = floorStopAt(me, now);
  const floorStop = formatFloorStop(me, now);
  const timeLeft = floorStop ? formatDuration((floorAt - now) / 1000) : '';
  const warning = me.cull_warning && !cullDone(me.cull_warning) ? me.cull_warning : null;
  const warned = formatCullWarning(me.cull_warning, now);
  // the next thing that happens: the floor stop when it comes before the warning's deadline
  const floorFirst = !!floorStop && !!warning && !(floorAt > Date.parse(warning.deadline));
  const floorNear = floorFirst || (!!floorStop && (floorAt - now) / 1000 <= NEAR_FLOOR_S);
  const cull = floorFirst ? floorStop : warned;
  const left = floorFirst ? '' : floorNear ? floorStop : timeLeft ? `${timeLeft} left` : '';
  const borrowed = (me.allocations || []).some(a => a.borrowed);
  const delayed = me.accounting?.status === 'delayed';
  const title = [
    `GPU pool: ${balance} (${stateLabel(state)})`,
    burn ? `burning ${burn.slice(1)} on running GPU servers` : 'no GPU server running',
    floorFirst
      ? `WARNING: ${floorStop}, before the cull warning's ${warned}: ${warning?.reason ?? ''}`
      : warned
        ? `WARNING: ${warned}: ${me.cull_warning?.reason ?? ''}`
        : '',
    floorStop && !floorFirst ? floorStop : '',
    borrowed ? 'holding borrowed GPUs' : '',
    delayed ? 'accounting delayed' : '',
    'click for details'
  ]
    .filter(Boolean)
    .join('\n');
  return { state, balance, burn, timeLeft, left, cull, floorStop, floorFirst, floorNear, borrowed, delayed, title };
}
