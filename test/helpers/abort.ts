/** The code of the abort that ends `signal`: at once if it is aborted already (a listener added then would never hear it). */
export function abortCode(signal: AbortSignal): Promise<string> {
  return new Promise((resolve) => {
    const settle = () => resolve((signal.reason as { code: string }).code);
    if (signal.aborted) settle();
    else signal.addEventListener('abort', settle, { once: true });
  });
}
