/**
 * The memory warning of a time-shared GPU fraction (issue 16.2): the node agent
 * found the user's processes on a shared GPU holding more memory than their
 * share allows, and will stop the biggest of them at `deadline` unless memory
 * is freed. Text helpers are pure (unit-tested in test/memory.test.ts); the
 * render helper builds the panel's box.
 */
import { formatCountdown } from './format';

/** One entry of `GET me`'s `memory_warnings`. */
export interface IMemoryWarning {
  server: string;
  gpu_uuid: string;
  gpu_index: number;
  /** The share, in thousandths of the GPU (500 = half). */
  fraction_milli: number;
  limit_bytes: number;
  used_bytes: number;
  since: string;
  deadline: string;
}

const GIB = 1024 ** 3;

/** "44.0 GiB" */
export function formatGiB(bytes: number): string {
  return `${(bytes / GIB).toFixed(1)} GiB`;
}

/** "GPU memory 50.0/44.0 GiB": short, for the status bar; empty without warnings. */
export function memoryFlag(warnings: IMemoryWarning[] | null | undefined): string {
  if (!warnings || !warnings.length) {
    return '';
  }
  const w = warnings[0];
  return `GPU memory ${(w.used_bytes / GIB).toFixed(1)}/${formatGiB(w.limit_bytes)}`;
}

/** The headline and the explanation of one warning. */
export function memoryWarningText(w: IMemoryWarning, now: number): { title: string; detail: string } {
  const share = (w.fraction_milli / 1000).toString();
  const server = w.server ? ` (server ${w.server})` : '';
  return {
    title: `GPU memory over your share: ${formatGiB(w.used_bytes)} of ${formatGiB(w.limit_bytes)} allowed`,
    detail:
      `Your ${share} share of GPU ${w.gpu_index}${server} may hold ${formatGiB(w.limit_bytes)} of GPU memory. ` +
      `In ${formatCountdown(w.deadline, now)} your processes using the most GPU memory on it are stopped ` +
      'until the rest fits, unless you free memory first (restart or shut down a kernel, delete big tensors).'
  };
}

/** Appends the panel's box for the warnings to `parent`; nothing when there are none. */
export function appendMemoryWarnings(
  parent: HTMLElement,
  warnings: IMemoryWarning[] | null | undefined,
  now: number
): void {
  if (!warnings || !warnings.length) {
    return;
  }
  const box = document.createElement('div');
  box.className = 'gp-BalancePanel-cull gp-BalancePanel-memory';
  box.dataset.gpupool = 'memory';
  for (const w of warnings) {
    const text = memoryWarningText(w, now);
    const title = document.createElement('strong');
    title.textContent = `\u26a0 ${text.title}`;
    const detail = document.createElement('div');
    detail.textContent = text.detail;
    box.append(title, detail);
  }
  parent.append(box);
}
